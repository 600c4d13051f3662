//! The host's side of the test networks: subnets no host route overlaps, and the iptables
//! rules CNI plugins leave for pods a test never tore down.

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

/// The test networks' address space, 198.18.0.0/15: set aside for network tests (RFC 2544),
/// so it is not the 10/8 that pod CIDRs, VPNs, cloud networks and `make run`'s own
/// 10.88.0.0/16 take. A network gets `198.18.<tag>.0/24`, else `198.19.<tag>.0/24`.
const TEST_SPACE: [u8; 2] = [198, 18];

/// A /24 for one test network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subnet {
    pub network: Ipv4Addr,
    pub prefix_len: u8,
}

impl Subnet {
    pub fn cidr(&self) -> String {
        format!("{}/{}", self.network, self.prefix_len)
    }

    /// The text every address of the subnet starts with (`198.18.88.`).
    pub fn text_prefix(&self) -> String {
        let [a, b, c, _] = self.network.octets();
        format!("{a}.{b}.{c}.")
    }

    fn overlaps(&self, other: &Subnet) -> bool {
        let len = self.prefix_len.min(other.prefix_len);
        let mask = if len == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(len))
        };
        u32::from(self.network) & mask == u32::from(other.network) & mask
    }
}

/// A host route that is in a candidate's way.
#[derive(Debug, Clone)]
pub struct HostRoute {
    pub destination: Subnet,
    /// What the route says: its destination, type, device and table as `ip route` prints them.
    pub description: String,
    pub device: Option<String>,
}

/// Every IPv4 route of the host, in all tables, but the default routes, and every IPv4
/// address of its interfaces (an interface that is down has its address but no route).
pub fn host_routes() -> Vec<HostRoute> {
    let routes = ip_json(&["-4", "route", "show", "table", "all"]);
    let links = ip_json(&["-4", "addr", "show"]);
    routes
        .iter()
        .filter_map(parse_route)
        .chain(links.iter().flat_map(parse_addresses))
        .collect()
}

fn ip_json(args: &[&str]) -> Vec<serde_json::Value> {
    let out = Command::new("ip")
        .arg("-j")
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .expect("run ip");
    assert!(out.status.success(), "ip -j {args:?} failed");
    serde_json::from_slice(&out.stdout).expect("ip's JSON")
}

fn parse_addresses(link: &serde_json::Value) -> Vec<HostRoute> {
    let device = link["ifname"].as_str().unwrap_or_default();
    let Some(addresses) = link["addr_info"].as_array() else {
        return Vec::new();
    };
    addresses
        .iter()
        .filter_map(|a| {
            let local = a["local"].as_str()?;
            let len = a["prefixlen"].as_u64()?;
            Some(HostRoute {
                destination: Subnet {
                    network: local.parse().ok()?,
                    prefix_len: u8::try_from(len).ok()?,
                },
                description: format!("address {local}/{len} on {device}"),
                device: Some(device.to_string()),
            })
        })
        .collect()
}

fn parse_route(route: &serde_json::Value) -> Option<HostRoute> {
    let dst = route["dst"].as_str()?;
    if dst == "default" {
        return None;
    }
    let (address, len) = dst.split_once('/').unwrap_or((dst, "32"));
    let destination = Subnet {
        network: address.parse().ok()?,
        prefix_len: len.parse().ok()?,
    };
    let device = route["dev"].as_str().map(String::from);
    let mut description = format!("route {dst}");
    for (key, label) in [("type", ""), ("dev", "dev "), ("table", "table ")] {
        if let Some(value) = route[key].as_str() {
            description.push_str(&format!(" {label}{value}"));
        }
    }
    Some(HostRoute {
        destination,
        description,
        device,
    })
}

/// The subnets a test network with `tag` may take, in order.
pub fn candidates(tag: u8) -> [Subnet; 2] {
    let [a, b] = TEST_SPACE;
    [b, b + 1].map(|second| Subnet {
        network: Ipv4Addr::new(a, second, tag, 0),
        prefix_len: 24,
    })
}

/// The first candidate for `tag` that no route in `routes` overlaps, ignoring routes through
/// `own_interface` (the network's bridge, left by an earlier run of the same test); or a
/// message naming each conflicting route and interface.
pub fn pick_subnet(tag: u8, own_interface: &str, routes: &[HostRoute]) -> Result<Subnet, String> {
    let mut conflicts = Vec::new();
    for candidate in candidates(tag) {
        let in_the_way: Vec<&HostRoute> = routes
            .iter()
            .filter(|r| r.device.as_deref() != Some(own_interface))
            .filter(|r| r.destination.overlaps(&candidate))
            .collect();
        if in_the_way.is_empty() {
            return Ok(candidate);
        }
        for route in in_the_way {
            conflicts.push(format!(
                "{} overlaps the host's {}",
                candidate.cidr(),
                route.description
            ));
        }
    }
    Err(format!(
        "no free subnet for the test network of tag {tag}: {}. The tests take subnets in \
         198.18.0.0/15 (set aside for network tests); free one of these by deleting that \
         route or the interface that holds it (`ip route del ...`, `ip link del ...`)",
        conflicts.join("; ")
    ))
}

/// The subnet for the test network with `tag` on bridge `bridge`, looked up in the host's
/// routes now; panics with the conflicting routes when both candidates are taken.
pub fn free_subnet(tag: u8, bridge: &str) -> Subnet {
    pick_subnet(tag, bridge, &host_routes()).unwrap_or_else(|message| panic!("{message}"))
}

/// Removes the iptables rules CNI plugins (bridge's ipMasq, portmap) made for pods on the
/// network `name` and the per-pod chains they jump to, in the nat and filter tables: what a
/// pod left without a CNI DEL keeps on the host. The rules carry the network's name in their
/// comment (`name: "<name>" id: "<container>"`).
pub fn remove_cni_rules(name: &str) {
    for table in ["nat", "filter"] {
        let Ok(out) = Command::new("iptables-save").args(["-t", table]).output() else {
            return;
        };
        let commands = removal_commands(&String::from_utf8_lossy(&out.stdout), name);
        if commands.is_empty() {
            continue;
        }
        let script = format!("*{table}\n{}COMMIT\n", commands.concat());
        let restored = Command::new("iptables-restore")
            .args(["--noflush", "-w"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .and_then(|mut child| {
                use std::io::Write as _;
                if let Some(mut stdin) = child.stdin.take() {
                    stdin.write_all(script.as_bytes())?;
                }
                child.wait()
            });
        if !restored.is_ok_and(|s| s.success()) {
            eprintln!("could not remove the iptables rules of network {name} ({table})");
        }
    }
}

/// iptables-restore lines that delete the rules of `iptables-save` output naming network
/// `name` in their comment, then flush and delete the per-pod `CNI-` chains they jump to
/// (never portmap's shared `CNI-HOSTPORT-` chains).
pub fn removal_commands(saved: &str, name: &str) -> Vec<String> {
    let marker = format!("name: \\\"{name}\\\"");
    let rules: Vec<&str> = saved
        .lines()
        .filter(|l| l.starts_with("-A ") && l.contains(&marker))
        .collect();
    let mut chains: Vec<&str> = rules
        .iter()
        .filter_map(|rule| rule.split_whitespace().skip_while(|w| *w != "-j").nth(1))
        .filter(|target| target.starts_with("CNI-") && !target.starts_with("CNI-HOSTPORT-"))
        .collect();
    chains.sort_unstable();
    chains.dedup();
    let in_removed_chain = |rule: &&str| {
        rule.split_whitespace()
            .nth(1)
            .is_some_and(|c| chains.contains(&c))
    };
    let mut commands: Vec<String> = rules
        .iter()
        .filter(|rule| !in_removed_chain(rule))
        .map(|rule| format!("-D {}\n", &rule[3..]))
        .collect();
    commands.extend(chains.iter().map(|c| format!("-F {c}\n")));
    commands.extend(chains.iter().map(|c| format!("-X {c}\n")));
    commands
}
