//! The files every pod shares with its containers.

/// `resolv.conf` for a pod's DNS config: its name servers, then its search domains and its
/// options, each on one line when it has any.
pub fn resolv_conf(servers: &[String], searches: &[String], options: &[String]) -> String {
    let mut text = String::new();
    for server in servers {
        text.push_str(&format!("nameserver {server}\n"));
    }
    if !searches.is_empty() {
        text.push_str(&format!("search {}\n", searches.join(" ")));
    }
    if !options.is_empty() {
        text.push_str(&format!("options {}\n", options.join(" ")));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_then_searches_then_options() {
        let text = resolv_conf(
            &["10.0.0.10".into(), "8.8.8.8".into()],
            &[
                "default.svc.cluster.local".into(),
                "svc.cluster.local".into(),
            ],
            &["ndots:5".into()],
        );
        assert_eq!(
            text,
            "nameserver 10.0.0.10\nnameserver 8.8.8.8\nsearch default.svc.cluster.local svc.cluster.local\noptions ndots:5\n"
        );
    }

    #[test]
    fn lines_without_values_are_left_out() {
        assert_eq!(
            resolv_conf(&["1.1.1.1".into()], &[], &[]),
            "nameserver 1.1.1.1\n"
        );
        assert_eq!(resolv_conf(&[], &[], &[]), "");
    }
}
