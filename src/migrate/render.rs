//! The migrated config as a file: a header comment, then the settings that differ from
//! crius's defaults. The maps that replace crius's defaults as a whole (runtime handlers,
//! registry credentials) are written whole, each entry without its default fields.

use toml::{Table, Value};

use super::{MigrateError, Migration};
use crate::config::{Config, RUNC_RUNTIME_TYPES, RegistryAuth, RuntimeConfig};

/// Maps written whole when they differ: a map in the file replaces crius's default map.
const WHOLE_MAPS: &[&str] = &["containerd.runtimes", "registry.configs"];

pub(super) fn render(migration: &Migration) -> Result<String, MigrateError> {
    let ours = to_table(&migration.config)?;
    let defaults = to_table(&Config::default())?;
    let body = toml::to_string(&diff(&ours, &defaults, ""))
        .map_err(|e| MigrateError::Render(e.to_string()))?;
    Ok(format!("{}\n{body}", header(migration)))
}

fn to_table<T: serde::Serialize>(value: &T) -> Result<Table, MigrateError> {
    Table::try_from(value).map_err(|e| MigrateError::Render(e.to_string()))
}

fn header(migration: &Migration) -> String {
    let mut text = format!(
        "# crius configuration migrated by `crius config migrate` from the CRI settings in\n\
         # {} (containerd config version {}).\n\
         # Only settings that differ from crius's defaults are written (`crius config default`\n\
         # shows them all); what could not be carried over was listed when this was made.\n",
        migration.source.display(),
        migration.version
    );
    let config = &migration.config;
    let runc_handlers = config.containerd.runtimes.values().any(|r| {
        r.runtime_type != crate::config::CRIUS_SHIM
            && RUNC_RUNTIME_TYPES.contains(&r.runtime_type.as_str())
    });
    if runc_handlers {
        text.push_str(
            "#\n\
             # Runtime handlers keep their containerd runtime_type: \"io.containerd.runc.v2\" runs\n\
             # on containerd's Go runc shim as before. crius's own shim, runtime_type =\n\
             # \"io.containerd.crius.v2\", runs runc with the same options in one small process\n\
             # per pod: switch a handler to it once containerd-shim-crius-v2 is on containerd's PATH.\n",
        );
    }
    if !config.image.sandbox_image.is_empty() {
        text.push_str(
            "#\n\
             # image.sandbox_image is kept as containerd had it; remove the line to use crius's\n\
             # built-in pause image, which needs no pull.\n",
        );
    }
    if !migration.hosts_files.is_empty() {
        text.push_str(&format!(
            "#\n\
             # registry.config_path holds the hosts.toml files written for the deprecated\n\
             # registry mirrors and TLS settings ({}).\n",
            migration
                .hosts_files
                .iter()
                .map(|f| f.host.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    text
}

/// The keys of `ours` whose values differ from `defaults`.
fn diff(ours: &Table, defaults: &Table, path: &str) -> Table {
    let mut out = Table::new();
    for (key, value) in ours {
        let full = if path.is_empty() {
            key.clone()
        } else {
            format!("{path}.{key}")
        };
        let default = defaults.get(key);
        if default == Some(value) {
            continue;
        }
        let shown = match (value, default) {
            (Value::Table(entries), _) if WHOLE_MAPS.contains(&full.as_str()) => {
                Value::Table(compact_entries(entries, &full))
            }
            (Value::Table(t), Some(Value::Table(d))) => Value::Table(diff(t, d, &full)),
            _ => value.clone(),
        };
        if !matches!(&shown, Value::Table(t) if t.is_empty()) {
            out.insert(key.clone(), shown);
        }
    }
    out
}

/// Each entry of a whole map without the fields at their defaults (a runtime handler
/// keeps its runtime_type, which is what makes it what it is).
fn compact_entries(entries: &Table, path: &str) -> Table {
    let (entry_default, keep): (Option<Table>, &[&str]) = if path == "containerd.runtimes" {
        (to_table(&RuntimeConfig::default()).ok(), &["runtime_type"])
    } else {
        let auth = to_table(&RegistryAuth::default()).ok();
        (
            auth.map(|a| Table::from_iter([("auth".to_string(), Value::Table(a))])),
            &[],
        )
    };
    let entry_default = entry_default.unwrap_or_default();
    let mut out = Table::new();
    for (name, entry) in entries {
        let compact = match entry {
            Value::Table(fields) => {
                let mut fields_out = Table::new();
                for key in keep {
                    if let Some(v) = fields.get(*key) {
                        fields_out.insert((*key).to_string(), v.clone());
                    }
                }
                for (key, value) in diff(fields, &entry_default, "") {
                    fields_out.entry(key).or_insert(value);
                }
                Value::Table(fields_out)
            }
            other => other.clone(),
        };
        out.insert(name.clone(), compact);
    }
    out
}
