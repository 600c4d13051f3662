//! Registry hosts, configured as containerd does it: `<config_path>/<host>/hosts.toml`
//! (or `<config_path>/_default/hosts.toml`) lists mirrors under `[host."<url>"]`, tried in
//! file order, then the upstream `server`. Operators reuse the directory they already have.
//!
//! Without a file, a registry is reached at `https://<host>` (Docker Hub at
//! `registry-1.docker.io`), and over plain HTTP when the host is this machine.

use std::path::{Path, PathBuf};

use toml::Value;

/// What a host may be used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    pub pull: bool,
    pub resolve: bool,
    pub push: bool,
}

impl Capabilities {
    const ALL: Self = Self {
        pull: true,
        resolve: true,
        push: true,
    };
}

/// One place to fetch from: a mirror or the upstream registry.
#[derive(Debug, Clone, PartialEq)]
pub struct RegistryEndpoint {
    /// `scheme://host[:port]`.
    pub base: String,
    /// The API path prefix, `/v2` unless the configuration says otherwise.
    pub path_prefix: String,
    pub capabilities: Capabilities,
    pub skip_verify: bool,
    /// CA certificates (PEM files) to trust in addition to the system's.
    pub ca: Vec<PathBuf>,
    /// Client certificates: (certificate, key) PEM files; the key may be in the first file.
    pub client: Vec<(PathBuf, Option<PathBuf>)>,
    pub headers: Vec<(String, String)>,
}

impl RegistryEndpoint {
    /// `host[:port]` of this endpoint, the key for credentials.
    pub fn host(&self) -> &str {
        self.base
            .split_once("://")
            .map(|(_, host)| host)
            .unwrap_or(&self.base)
    }

    pub fn is_plain_http(&self) -> bool {
        self.base.starts_with("http://")
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid registry hosts file {file}: {reason}")]
pub struct HostsError {
    pub file: PathBuf,
    pub reason: String,
}

/// The largest hosts.toml read.
const MAX_HOSTS_FILE: u64 = 1024 * 1024;

/// The endpoints to try for `registry` (a reference's domain), in order.
pub fn endpoints(config_path: &str, registry: &str) -> Result<Vec<RegistryEndpoint>, HostsError> {
    if !config_path.is_empty() {
        let root = Path::new(config_path);
        for dir in [root.join(registry), root.join("_default")] {
            let file = dir.join("hosts.toml");
            match crate::sys::fsutil::read_bounded_string(&file, MAX_HOSTS_FILE) {
                Ok(text) => {
                    return parse_hosts(&text, &dir, registry)
                        .map_err(|reason| HostsError { file, reason });
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => {
                    return Err(HostsError {
                        file,
                        reason: e.to_string(),
                    });
                }
            }
        }
    }
    Ok(vec![default_endpoint(registry)])
}

fn default_server(registry: &str) -> String {
    let scheme = if is_local(registry) { "http" } else { "https" };
    let host = if registry == "docker.io" {
        "registry-1.docker.io"
    } else {
        registry
    };
    format!("{scheme}://{host}")
}

fn default_endpoint(registry: &str) -> RegistryEndpoint {
    RegistryEndpoint {
        base: default_server(registry),
        path_prefix: "/v2".to_string(),
        capabilities: Capabilities::ALL,
        skip_verify: false,
        ca: Vec::new(),
        client: Vec::new(),
        headers: Vec::new(),
    }
}

/// Whether `host[:port]` names this machine.
pub fn is_local(registry: &str) -> bool {
    let host = match registry.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => registry,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn parse_hosts(text: &str, dir: &Path, registry: &str) -> Result<Vec<RegistryEndpoint>, String> {
    let table: toml::Table = toml::from_str(text).map_err(|e| e.to_string())?;
    let mut endpoints = Vec::new();
    if let Some(hosts) = table.get("host") {
        let hosts = hosts.as_table().ok_or("\"host\" must be a table")?;
        for (url, settings) in hosts {
            let settings = settings
                .as_table()
                .ok_or_else(|| format!("host {url:?} must be a table"))?;
            endpoints.push(endpoint(url, settings, dir).map_err(|e| format!("host {url:?}: {e}"))?);
        }
    }
    let server = match table.get("server") {
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err("\"server\" must be a string".to_string()),
        None => default_server(registry),
    };
    let mut upstream = table.clone();
    upstream.remove("host");
    upstream.remove("server");
    endpoints.push(endpoint(&server, &upstream, dir).map_err(|e| format!("server: {e}"))?);
    Ok(endpoints)
}

fn endpoint(url: &str, settings: &toml::Table, dir: &Path) -> Result<RegistryEndpoint, String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| format!("{url:?} has no scheme (http:// or https://)"))?;
    if scheme != "http" && scheme != "https" {
        return Err(format!("unsupported scheme {scheme:?}"));
    }
    let (host, path) = match rest.find('/') {
        Some(slash) => (&rest[..slash], rest[slash..].trim_end_matches('/')),
        None => (rest, ""),
    };
    if host.is_empty() {
        return Err(format!("{url:?} has no host"));
    }
    let override_path = bool_setting(settings, "override_path")?;
    let path_prefix = if override_path || path.ends_with("/v2") {
        path.to_string()
    } else {
        format!("{path}/v2")
    };
    let capabilities = match settings.get("capabilities") {
        None => Capabilities::ALL,
        Some(value) => {
            let mut caps = Capabilities {
                pull: false,
                resolve: false,
                push: false,
            };
            for cap in strings(value, "capabilities")? {
                match cap.as_str() {
                    "pull" => caps.pull = true,
                    "resolve" => caps.resolve = true,
                    "push" => caps.push = true,
                    other => return Err(format!("unknown capability {other:?}")),
                }
            }
            caps
        }
    };
    let ca = match settings.get("ca") {
        None => Vec::new(),
        Some(value) => strings(value, "ca")?
            .into_iter()
            .map(|p| resolve(dir, &p))
            .collect(),
    };
    let client = match settings.get("client") {
        None => Vec::new(),
        Some(value) => client_certs(value, dir)?,
    };
    let mut headers = Vec::new();
    if let Some(value) = settings.get("header") {
        let table = value.as_table().ok_or("\"header\" must be a table")?;
        for (name, values) in table {
            for v in strings(values, "header")? {
                headers.push((name.clone(), v));
            }
        }
    }
    Ok(RegistryEndpoint {
        base: format!("{scheme}://{host}"),
        path_prefix,
        capabilities,
        skip_verify: bool_setting(settings, "skip_verify")?,
        ca,
        client,
        headers,
    })
}

fn bool_setting(settings: &toml::Table, key: &str) -> Result<bool, String> {
    match settings.get(key) {
        None => Ok(false),
        Some(Value::Boolean(b)) => Ok(*b),
        Some(_) => Err(format!("\"{key}\" must be true or false")),
    }
}

/// A string or an array of strings.
fn strings(value: &Value, key: &str) -> Result<Vec<String>, String> {
    match value {
        Value::String(s) => Ok(vec![s.clone()]),
        Value::Array(items) => items
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| format!("\"{key}\" entries must be strings"))
            })
            .collect(),
        _ => Err(format!("\"{key}\" must be a string or an array of strings")),
    }
}

/// `client = "cert.pem"`, `["cert.pem", "key.pem"]` or `[["cert", "key"], ...]`.
fn client_certs(value: &Value, dir: &Path) -> Result<Vec<(PathBuf, Option<PathBuf>)>, String> {
    match value {
        Value::String(cert) => Ok(vec![(resolve(dir, cert), None)]),
        Value::Array(items) if items.iter().all(Value::is_str) => {
            let files: Vec<PathBuf> = items
                .iter()
                .filter_map(Value::as_str)
                .map(|p| resolve(dir, p))
                .collect();
            match files.as_slice() {
                [cert] => Ok(vec![(cert.clone(), None)]),
                [cert, key] => Ok(vec![(cert.clone(), Some(key.clone()))]),
                _ => Err("\"client\" must be [cert] or [cert, key]".to_string()),
            }
        }
        Value::Array(items) => items
            .iter()
            .map(|pair| match client_certs(pair, dir)?.as_slice() {
                [one] => Ok(one.clone()),
                _ => Err("\"client\" pairs must be [cert, key]".to_string()),
            })
            .collect(),
        _ => Err("\"client\" must be a path or [cert, key] pairs".to_string()),
    }
}

fn resolve(dir: &Path, path: &str) -> PathBuf {
    let path = Path::new(path);
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        dir.join(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_hosts(root: &Path, host: &str, text: &str) {
        std::fs::create_dir_all(root.join(host)).unwrap();
        std::fs::write(root.join(host).join("hosts.toml"), text).unwrap();
    }

    #[test]
    fn defaults_without_config() {
        let hub = endpoints("", "docker.io").unwrap();
        assert_eq!(hub[0].base, "https://registry-1.docker.io");
        assert_eq!(hub[0].path_prefix, "/v2");
        assert_eq!(endpoints("", "quay.io").unwrap()[0].base, "https://quay.io");
        assert_eq!(
            endpoints("", "127.0.0.1:5010").unwrap()[0].base,
            "http://127.0.0.1:5010"
        );
        assert_eq!(
            endpoints("", "localhost").unwrap()[0].base,
            "http://localhost"
        );
    }

    #[test]
    fn mirror_first_then_upstream() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_str().unwrap();
        write_hosts(
            dir.path(),
            "registry.k8s.io",
            r#"server = "https://registry.k8s.io"
[host."http://127.0.0.1:5000"]
  capabilities = ["pull", "resolve"]
[host."https://mirror.example.com/base"]
  capabilities = ["pull"]
  skip_verify = true
  ca = "ca.pem"
  client = [["client.cert", "client.key"]]
  [host."https://mirror.example.com/base".header]
    x-custom = ["a", "b"]
"#,
        );
        let eps = endpoints(root, "registry.k8s.io").unwrap();
        assert_eq!(eps.len(), 3);
        assert_eq!(eps[0].base, "http://127.0.0.1:5000");
        assert!(eps[0].capabilities.resolve && !eps[0].capabilities.push);
        assert_eq!(eps[1].base, "https://mirror.example.com");
        assert_eq!(eps[1].path_prefix, "/base/v2");
        assert!(eps[1].skip_verify);
        assert!(!eps[1].capabilities.resolve);
        assert_eq!(eps[1].ca, vec![dir.path().join("registry.k8s.io/ca.pem")]);
        assert_eq!(
            eps[1].client[0].1,
            Some(dir.path().join("registry.k8s.io/client.key"))
        );
        assert_eq!(eps[1].headers.len(), 2);
        assert_eq!(eps[2].base, "https://registry.k8s.io");
        assert!(eps[2].capabilities.push);
        assert_eq!(eps[0].host(), "127.0.0.1:5000");
    }

    #[test]
    fn override_path_and_default_dir() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_str().unwrap();
        write_hosts(
            dir.path(),
            "_default",
            r#"[host."https://proxy.example.com/registry/v2/cache"]
  override_path = true
"#,
        );
        let eps = endpoints(root, "ghcr.io").unwrap();
        assert_eq!(eps[0].path_prefix, "/registry/v2/cache");
        assert_eq!(eps[1].base, "https://ghcr.io");
    }

    #[test]
    fn invalid_files_name_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_str().unwrap();
        write_hosts(dir.path(), "a.io", "[host.\"ftp://x\"]\n");
        let err = endpoints(root, "a.io").unwrap_err();
        assert!(err.reason.contains("unsupported scheme"), "{err}");
        write_hosts(
            dir.path(),
            "b.io",
            "[host.\"https://x\"]\ncapabilities = [\"fly\"]\n",
        );
        let err = endpoints(root, "b.io").unwrap_err();
        assert!(err.reason.contains("unknown capability"), "{err}");
    }

    #[test]
    fn local_hosts() {
        assert!(is_local("localhost:5000"));
        assert!(is_local("127.0.0.1"));
        assert!(is_local("[::1]:5000"));
        assert!(!is_local("registry.k8s.io"));
        assert!(!is_local("10.0.0.1:5000"));
    }
}

#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(crate::fuzz_config())]

        #[test]
        fn any_hosts_toml_parses_or_fails_cleanly(text in "\\PC{0,400}") {
            let _ = parse_hosts(&text, Path::new("/nonexistent"), "registry.example");
        }

        #[test]
        fn host_tables_with_any_settings_parse_or_fail_cleanly(
            url in "[a-z]{1,5}://[a-z0-9.:]{1,20}",
            key in "[a-z_]{1,12}",
            value in "\\PC{0,20}",
        ) {
            let text = format!("[host.\"{url}\"]\n{key} = {value:?}\n");
            let _ = parse_hosts(&text, Path::new("/nonexistent"), "registry.example");
        }
    }
}
