//! Loading CNI network configurations from the conf dir, as libcni and go-cni do.
//!
//! Files named `*.conflist`, `*.conf` and `*.json` are read in name order; a single-plugin
//! `.conf`/`.json` becomes a one-plugin list. Unlike go-cni, one broken file does not hide
//! the valid ones after it: it is skipped, and its reason is kept for the status message.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{Map, Value};

/// CNI spec versions crius can drive.
pub const SUPPORTED_VERSIONS: &[&str] = &[
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];

/// One network: an ordered list of plugins, as read from a conf file.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkConfigList {
    pub name: String,
    pub cni_version: String,
    pub disable_check: bool,
    /// Each plugin's configuration object, with its `type`.
    pub plugins: Vec<Map<String, Value>>,
    /// The file it came from.
    pub source: PathBuf,
}

impl NetworkConfigList {
    /// The `type` (binary name) of each plugin, in order.
    pub fn plugin_types(&self) -> impl Iterator<Item = &str> {
        self.plugins
            .iter()
            .filter_map(|p| p.get("type").and_then(Value::as_str))
    }
}

/// Why the conf dir yielded no usable network.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LoadError {
    #[error("failed to read CNI conf dir {dir}: {reason}")]
    ReadDir { dir: PathBuf, reason: String },
    #[error("no network config found in {dir}{}", rejected_suffix(.rejected))]
    NoConfig {
        dir: PathBuf,
        /// Files that were present but invalid, with the reason.
        rejected: Vec<(PathBuf, String)>,
    },
}

fn rejected_suffix(rejected: &[(PathBuf, String)]) -> String {
    rejected
        .iter()
        .map(|(path, reason)| format!("; rejected {}: {reason}", path.display()))
        .collect()
}

/// The outcome of loading the conf dir: the networks in use and the files passed over.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Loaded {
    pub networks: Vec<NetworkConfigList>,
    pub rejected: Vec<(PathBuf, String)>,
}

/// Loads up to `max` networks (0: all) from `dir`.
pub fn load_networks(dir: &Path, max: usize) -> Result<Loaded, LoadError> {
    let files = conf_files(dir)?;
    let mut loaded = Loaded::default();
    for file in files {
        if max != 0 && loaded.networks.len() >= max {
            break;
        }
        match load_file(&file) {
            Ok(list) => loaded.networks.push(list),
            Err(reason) => {
                tracing::warn!(file = %file.display(), %reason, "ignoring invalid CNI config file");
                loaded.rejected.push((file, reason));
            }
        }
    }
    if loaded.networks.is_empty() {
        return Err(LoadError::NoConfig {
            dir: dir.to_path_buf(),
            rejected: loaded.rejected,
        });
    }
    Ok(loaded)
}

/// The conf dir's candidate files, sorted by name.
fn conf_files(dir: &Path) -> Result<Vec<PathBuf>, LoadError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(LoadError::NoConfig {
                dir: dir.to_path_buf(),
                rejected: Vec::new(),
            });
        }
        Err(e) => {
            return Err(LoadError::ReadDir {
                dir: dir.to_path_buf(),
                reason: e.to_string(),
            });
        }
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("conflist" | "conf" | "json")
            ) && p.is_file()
        })
        .collect();
    files.sort();
    Ok(files)
}

/// The largest network config file read.
const MAX_CONF_FILE: u64 = 1024 * 1024;

fn load_file(path: &Path) -> Result<NetworkConfigList, String> {
    // The conf dir is someone else's: no FIFO, device or endless file is read.
    let bytes = crate::sys::fsutil::read_bounded(path, MAX_CONF_FILE)
        .map_err(|e| format!("cannot read: {e}"))?;
    let is_list = path.extension().and_then(|e| e.to_str()) == Some("conflist");
    parse(&bytes, is_list, path)
}

/// Parses a conflist (`is_list`) or a single plugin conf into a network.
pub fn parse(bytes: &[u8], is_list: bool, source: &Path) -> Result<NetworkConfigList, String> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| format!("invalid JSON: {e}"))?;
    let Value::Object(obj) = value else {
        return Err("not a JSON object".to_string());
    };
    let name = string_field(&obj, "name")?;
    if name.is_empty() {
        return Err("missing network \"name\"".to_string());
    }
    if !is_valid_network_name(&name) {
        // libcni's rule: the name becomes part of cache paths.
        return Err(format!(
            "network name {name:?} must be letters, digits, '_', '.' or '-', starting with a \
             letter or digit"
        ));
    }
    let cni_version = string_field(&obj, "cniVersion")?;
    if !cni_version.is_empty() && !SUPPORTED_VERSIONS.contains(&cni_version.as_str()) {
        return Err(format!("unsupported cniVersion {cni_version:?}"));
    }
    let plugins = if is_list {
        let Some(Value::Array(raw)) = obj.get("plugins") else {
            return Err("missing \"plugins\" array".to_string());
        };
        if raw.is_empty() {
            return Err("\"plugins\" is empty".to_string());
        }
        raw.iter()
            .enumerate()
            .map(|(i, p)| match p {
                Value::Object(plugin) => Ok(plugin.clone()),
                _ => Err(format!("plugin {i} is not a JSON object")),
            })
            .collect::<Result<Vec<_>, _>>()?
    } else {
        vec![obj.clone()]
    };
    for (i, plugin) in plugins.iter().enumerate() {
        let kind = string_field(plugin, "type")?;
        if kind.is_empty() {
            return Err(format!("plugin {i} has no \"type\""));
        }
        if kind.contains('/') || kind == "." || kind == ".." {
            // A type names a binary in the plugin dirs, never a path to one elsewhere.
            return Err(format!(
                "plugin {i} type {kind:?} must be a plain file name"
            ));
        }
    }
    Ok(NetworkConfigList {
        name,
        cni_version,
        disable_check: obj
            .get("disableCheck")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        plugins,
        source: source.to_path_buf(),
    })
}

fn string_field(obj: &Map<String, Value>, key: &str) -> Result<String, String> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(format!("\"{key}\" must be a string")),
    }
}

/// libcni's network name rule: `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`.
fn is_valid_network_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_like_plugin_types_and_network_names_are_refused() {
        let parse_list = |text: &str| parse(text.as_bytes(), true, Path::new("x.conflist"));
        let ok = r#"{"cniVersion":"1.0.0","name":"pod-net.1","plugins":[{"type":"bridge"}]}"#;
        assert!(parse_list(ok).is_ok());
        for bad in [
            r#"{"cniVersion":"1.0.0","name":"../etc","plugins":[{"type":"bridge"}]}"#,
            r#"{"cniVersion":"1.0.0","name":"net","plugins":[{"type":"../../bin/sh"}]}"#,
            r#"{"cniVersion":"1.0.0","name":"net","plugins":[{"type":"/bin/sh"}]}"#,
            r#"{"cniVersion":"1.0.0","name":"-net","plugins":[{"type":"bridge"}]}"#,
        ] {
            assert!(parse_list(bad).is_err(), "{bad}");
        }
    }

    const BRIDGE: &str = r#"{"cniVersion":"1.0.0","name":"crius-net","plugins":[
        {"type":"bridge","bridge":"cni0","ipam":{"type":"host-local"}},
        {"type":"portmap","capabilities":{"portMappings":true}}]}"#;

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap();
    }

    #[test]
    fn loads_first_file_in_name_order() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "20-b.conflist",
            &BRIDGE.replace("crius-net", "second"),
        );
        write(dir.path(), "10-a.conflist", BRIDGE);
        let loaded = load_networks(dir.path(), 1).unwrap();
        assert_eq!(loaded.networks.len(), 1);
        assert_eq!(loaded.networks[0].name, "crius-net");
        assert_eq!(
            loaded.networks[0].plugin_types().collect::<Vec<_>>(),
            ["bridge", "portmap"]
        );
        assert_eq!(load_networks(dir.path(), 0).unwrap().networks.len(), 2);
    }

    #[test]
    fn single_plugin_conf_becomes_a_list() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "99-loop.conf",
            r#"{"cniVersion":"0.3.1","name":"lo","type":"loopback"}"#,
        );
        let loaded = load_networks(dir.path(), 1).unwrap();
        assert_eq!(
            loaded.networks[0].plugin_types().collect::<Vec<_>>(),
            ["loopback"]
        );
        assert_eq!(loaded.networks[0].cni_version, "0.3.1");
    }

    #[test]
    fn invalid_files_are_skipped_with_reasons() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "00-broken.conflist", "{not json");
        write(
            dir.path(),
            "01-noplugins.conflist",
            r#"{"name":"x","plugins":[]}"#,
        );
        write(dir.path(), "02-notype.conf", r#"{"name":"x"}"#);
        write(
            dir.path(),
            "03-badver.conflist",
            &BRIDGE.replace("1.0.0", "9.9.9"),
        );
        write(dir.path(), "notes.txt", "ignored");
        let err = load_networks(dir.path(), 1).unwrap_err();
        let LoadError::NoConfig { rejected, .. } = &err else {
            panic!("unexpected {err:?}");
        };
        assert_eq!(rejected.len(), 4);
        let text = err.to_string();
        assert!(text.contains("no network config found"), "{text}");
        assert!(text.contains("00-broken.conflist: invalid JSON"), "{text}");
        assert!(text.contains("\"plugins\" is empty"), "{text}");
        assert!(text.contains("has no \"type\""), "{text}");
        assert!(text.contains("unsupported cniVersion"), "{text}");

        write(dir.path(), "50-good.conflist", BRIDGE);
        let loaded = load_networks(dir.path(), 1).unwrap();
        assert_eq!(loaded.networks[0].name, "crius-net");
        assert_eq!(loaded.rejected.len(), 4);
    }

    #[test]
    fn missing_dir_is_no_config() {
        let dir = tempfile::tempdir().unwrap();
        let err = load_networks(&dir.path().join("absent"), 1).unwrap_err();
        assert!(matches!(err, LoadError::NoConfig { .. }));
    }
}

#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(crate::fuzz_config())]

        #[test]
        fn network_configs_of_any_bytes_parse_or_fail_cleanly(data in proptest::collection::vec(any::<u8>(), 0..1024)) {
            let _ = parse(&data, true, Path::new("x.conflist"));
            let _ = parse(&data, false, Path::new("x.conf"));
        }

        #[test]
        fn conflists_with_any_names_and_types_parse_or_fail_cleanly(name in "\\PC{0,20}", kind in "\\PC{0,20}") {
            let text = serde_json::json!({
                "cniVersion": "1.0.0",
                "name": name,
                "plugins": [{"type": kind}],
            })
            .to_string();
            if let Ok(list) = parse(text.as_bytes(), true, Path::new("x.conflist")) {
                prop_assert!(!list.plugins.is_empty());
                prop_assert!(!kind.contains('/'));
            }
        }
    }
}
