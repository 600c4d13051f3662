//! Network interface counters of a network namespace, from `/proc/<pid>/net/dev` of a
//! process inside it (no need to enter the namespace).

use std::io::Read;
use std::path::Path;

/// Bytes of `net/dev` read at most: a pod with CAP_NET_ADMIN can make thousands of
/// interfaces in its network namespace.
const MAX_NETDEV_BYTES: u64 = 256 * 1024;
/// Interfaces reported per pod at most; `eth0` (kubelet's) is always among them.
pub const MAX_INTERFACES: usize = 64;
/// The interface kubelet treats as the pod's own.
pub const DEFAULT_INTERFACE: &str = "eth0";

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InterfaceCounters {
    pub name: String,
    pub rx_bytes: u64,
    pub rx_errors: u64,
    pub tx_bytes: u64,
    pub tx_errors: u64,
}

/// The interfaces (loopback left out) of the netns `pid` lives in, at most
/// [`MAX_INTERFACES`] of them from the first [`MAX_NETDEV_BYTES`] of the table.
pub fn read_interfaces(pid: u32) -> std::io::Result<Vec<InterfaceCounters>> {
    let file = std::fs::File::open(Path::new("/proc").join(pid.to_string()).join("net/dev"))?;
    let mut bytes = Vec::new();
    file.take(MAX_NETDEV_BYTES).read_to_end(&mut bytes)?;
    // A table cut short ends in a partial line: its last number would be cut too.
    if bytes.len() as u64 == MAX_NETDEV_BYTES
        && let Some(end) = bytes.iter().rposition(|b| *b == b'\n')
    {
        bytes.truncate(end + 1);
    }
    Ok(bounded(parse(&String::from_utf8_lossy(&bytes))))
}

/// At most [`MAX_INTERFACES`] of `interfaces`, in their order, `eth0` kept.
fn bounded(mut interfaces: Vec<InterfaceCounters>) -> Vec<InterfaceCounters> {
    if interfaces.len() <= MAX_INTERFACES {
        return interfaces;
    }
    let default = interfaces
        .iter()
        .position(|i| i.name == DEFAULT_INTERFACE)
        .filter(|at| *at >= MAX_INTERFACES)
        .map(|at| interfaces.swap_remove(at));
    interfaces.truncate(MAX_INTERFACES - usize::from(default.is_some()));
    interfaces.extend(default);
    interfaces
}

/// Parses the `net/dev` table: after two header lines, `name: rx(8 columns) tx(8 columns)`.
pub fn parse(text: &str) -> Vec<InterfaceCounters> {
    text.lines()
        .skip(2)
        .filter_map(|line| {
            let (name, counters) = line.split_once(':')?;
            let name = name.trim();
            if name == "lo" {
                return None;
            }
            let values: Vec<u64> = counters
                .split_whitespace()
                .map(|v| v.parse().unwrap_or(0))
                .collect();
            if values.len() < 16 {
                return None;
            }
            Some(InterfaceCounters {
                name: name.to_string(),
                rx_bytes: values[0],
                rx_errors: values[2],
                tx_bytes: values[8],
                tx_errors: values[10],
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_proc_table_without_loopback() {
        let text = "\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:     100       1    0    0    0     0          0         0      100       1    0    0    0     0       0          0
  eth0:    1296      16    2    0    0     0          0         0      656       8    1    0    0     0       0          0
";
        assert_eq!(
            parse(text),
            vec![InterfaceCounters {
                name: "eth0".into(),
                rx_bytes: 1296,
                rx_errors: 2,
                tx_bytes: 656,
                tx_errors: 1,
            }]
        );
    }

    #[test]
    fn a_namespace_with_many_interfaces_reports_a_bounded_few_with_eth0() {
        let mut text = String::from("header\nheader\n");
        for i in 0..200 {
            text.push_str(&format!("  dummy{i}: 1 0 0 0 0 0 0 0 2 0 0 0 0 0 0 0\n"));
        }
        text.push_str("  eth0: 5 0 0 0 0 0 0 0 6 0 0 0 0 0 0 0\n");
        let interfaces = bounded(parse(&text));
        assert_eq!(interfaces.len(), MAX_INTERFACES);
        assert_eq!(interfaces[0].name, "dummy0");
        assert!(
            interfaces
                .iter()
                .any(|i| i.name == "eth0" && i.rx_bytes == 5)
        );
        // Few enough: all of them, in order.
        let few = bounded(parse("h\nh\n  a: 1 0 0 0 0 0 0 0 2 0 0 0 0 0 0 0\n"));
        assert_eq!(few.len(), 1);
    }

    #[test]
    fn reads_our_own_namespace() {
        let interfaces = read_interfaces(std::process::id()).unwrap();
        assert!(interfaces.iter().all(|i| i.name != "lo"));
    }
}
