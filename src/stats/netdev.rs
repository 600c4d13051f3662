//! Network interface counters of a network namespace, from `/proc/<pid>/net/dev` of a
//! process inside it (no need to enter the namespace).

use std::path::Path;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InterfaceCounters {
    pub name: String,
    pub rx_bytes: u64,
    pub rx_errors: u64,
    pub tx_bytes: u64,
    pub tx_errors: u64,
}

/// The interfaces (loopback left out) of the netns `pid` lives in.
pub fn read_interfaces(pid: u32) -> std::io::Result<Vec<InterfaceCounters>> {
    let text = std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("net/dev"))?;
    Ok(parse(&text))
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
    fn reads_our_own_namespace() {
        let interfaces = read_interfaces(std::process::id()).unwrap();
        assert!(interfaces.iter().all(|i| i.name != "lo"));
    }
}
