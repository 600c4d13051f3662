//! CNI results (spec 0.3.x, 0.4.0 and 1.x share this shape): the interfaces and IPs a
//! network's plugins set up.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CniResult {
    #[serde(default, rename = "cniVersion")]
    pub cni_version: String,
    #[serde(default)]
    pub interfaces: Vec<Interface>,
    #[serde(default)]
    pub ips: Vec<IpConfig>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Interface {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub mac: String,
    #[serde(default)]
    pub sandbox: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct IpConfig {
    /// `10.88.0.5/16`.
    pub address: String,
    #[serde(default)]
    pub gateway: Option<String>,
    /// Index into `interfaces`.
    #[serde(default)]
    pub interface: Option<usize>,
}

impl CniResult {
    pub fn parse(value: &serde_json::Value) -> Result<Self, String> {
        serde_json::from_value(value.clone()).map_err(|e| format!("malformed CNI result: {e}"))
    }

    /// The pod's addresses on `ifname` (all addresses when the result names no interfaces),
    /// IPv4 first, without prefix lengths.
    pub fn pod_ips(&self, ifname: &str) -> Vec<String> {
        let on_interface = |ip: &&IpConfig| match ip.interface {
            Some(i) => self
                .interfaces
                .get(i)
                .is_none_or(|iface| iface.name == ifname || iface.sandbox.is_empty()),
            None => true,
        };
        // A plugin's result is taken for what parses as an address, each once, a few at most.
        let mut ips: Vec<std::net::IpAddr> = Vec::new();
        for ip in self.ips.iter().filter(on_interface) {
            let text = ip.address.split('/').next().unwrap_or(&ip.address);
            if let Ok(ip) = text.parse::<std::net::IpAddr>()
                && !ips.contains(&ip)
                && ips.len() < MAX_POD_IPS
            {
                ips.push(ip);
            }
        }
        ips.sort_by_key(|ip| ip.is_ipv6());
        ips.into_iter().map(|ip| ip.to_string()).collect()
    }
}

/// A pod's CNI results merged the way containerd's CRI shows them (`cniResult` in the verbose
/// PodSandboxStatus, go-cni's `Result`): interfaces by name with their addresses, and every
/// result's DNS and routes. Null when the pod has no results (host network, or no ADD done).
pub fn go_cni_result(results: &[serde_json::Value]) -> serde_json::Value {
    use serde_json::{Map, Value, json};
    if results.is_empty() {
        return Value::Null;
    }
    let mut interfaces = Map::new();
    let mut dns = Vec::new();
    let mut routes = Vec::new();
    for value in results {
        let Ok(result) = CniResult::parse(value) else {
            continue;
        };
        for iface in &result.interfaces {
            interfaces.insert(
                iface.name.clone(),
                json!({"IPConfigs": [], "Mac": iface.mac, "Sandbox": iface.sandbox,
                       "PciID": "", "SocketPath": ""}),
            );
        }
        for ip in &result.ips {
            let Some(iface) = ip.interface.and_then(|i| result.interfaces.get(i)) else {
                continue;
            };
            let address = ip.address.split('/').next().unwrap_or(&ip.address);
            if let Some(configs) = interfaces
                .get_mut(&iface.name)
                .and_then(|c| c.get_mut("IPConfigs"))
                .and_then(Value::as_array_mut)
            {
                configs.push(json!({"IP": address, "Gateway": ip.gateway}));
            }
        }
        dns.push(value.get("dns").cloned().unwrap_or_else(|| json!({})));
        if let Some(more) = value.get("routes").and_then(Value::as_array) {
            routes.extend(more.iter().cloned());
        }
    }
    json!({"Interfaces": interfaces, "DNS": dns, "Routes": routes})
}

/// The most addresses a pod reports (kubelet takes one of each family).
const MAX_POD_IPS: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_addresses_are_reported_each_once_and_few() {
        let mut ips: Vec<serde_json::Value> = vec![
            serde_json::json!({"address": "not-an-ip/24"}),
            serde_json::json!({"address": "10.1.0.5/24"}),
            serde_json::json!({"address": "10.1.0.5/16"}),
        ];
        ips.extend((0..1000).map(|i| serde_json::json!({"address": format!("fd00::{i:x}/64")})));
        let result =
            CniResult::parse(&serde_json::json!({"cniVersion": "1.0.0", "ips": ips})).unwrap();
        let reported = result.pod_ips("eth0");
        assert_eq!(reported.len(), MAX_POD_IPS);
        assert_eq!(reported[0], "10.1.0.5");
        assert!(reported[1..].iter().all(|ip| ip.starts_with("fd00::")));
    }

    #[test]
    fn picks_the_pod_interface_addresses_ipv4_first() {
        let result = CniResult::parse(&serde_json::json!({
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": "cni0", "mac": "aa"},
                {"name": "veth1", "mac": "bb"},
                {"name": "eth0", "mac": "cc", "sandbox": "/var/run/netns/cni-1"}
            ],
            "ips": [
                {"address": "fd00::5/64", "interface": 2},
                {"address": "10.88.0.5/16", "gateway": "10.88.0.1", "interface": 2}
            ]
        }))
        .unwrap();
        assert_eq!(result.pod_ips("eth0"), vec!["10.88.0.5", "fd00::5"]);
    }

    #[test]
    fn version_0_3_results_parse() {
        let result = CniResult::parse(&serde_json::json!({
            "cniVersion": "0.3.1",
            "ips": [{"version": "4", "address": "10.1.2.3/24"}]
        }))
        .unwrap();
        assert_eq!(result.pod_ips("eth0"), vec!["10.1.2.3"]);
    }
}

#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(crate::fuzz_config())]

        #[test]
        fn results_of_any_json_parse_or_fail_cleanly(data in proptest::collection::vec(any::<u8>(), 0..1024)) {
            if let Ok(value) = serde_json::from_slice::<serde_json::Value>(&data) {
                let _ = CniResult::parse(&value);
            }
        }

        #[test]
        fn results_with_any_ips_and_interfaces_parse_or_fail_cleanly(
            version in "(0\\.[1-4]\\.[0-9]|1\\.[0-1]\\.0|[0-9.]{0,6})",
            address in "\\PC{0,24}",
            interface in proptest::option::of(-3i64..5),
        ) {
            let value = serde_json::json!({
                "cniVersion": version,
                "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/x"}],
                "ips": [{"address": address, "interface": interface}],
            });
            let _ = CniResult::parse(&value);
        }
    }

    #[test]
    fn results_merge_into_go_cnis_shape() {
        let bridge = serde_json::json!({
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "crius0", "mac": "aa"},
                           {"name": "eth0", "mac": "bb", "sandbox": "/var/run/netns/cni-1"}],
            "ips": [{"address": "10.88.0.5/16", "gateway": "10.88.0.1", "interface": 1}],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dns": {"nameservers": ["10.0.0.10"]}
        });
        let merged = go_cni_result(&[bridge]);
        let eth0 = &merged["Interfaces"]["eth0"];
        assert_eq!(eth0["Sandbox"], "/var/run/netns/cni-1");
        assert_eq!(eth0["IPConfigs"][0]["IP"], "10.88.0.5");
        assert_eq!(eth0["IPConfigs"][0]["Gateway"], "10.88.0.1");
        assert_eq!(merged["Interfaces"]["crius0"]["Mac"], "aa");
        assert_eq!(merged["Routes"][0]["dst"], "0.0.0.0/0");
        assert_eq!(merged["DNS"][0]["nameservers"][0], "10.0.0.10");
        assert_eq!(go_cni_result(&[]), serde_json::Value::Null);
    }
}
