//! The CRI plugin's `registry` table: `config_path`, credentials, and the deprecated
//! `mirrors` and `configs.<host>.tls`, which become hosts.toml files.

use std::collections::BTreeMap;

use super::Ctx;
use super::hosts::{self, HostPlan, Tls};
use super::layout::Layout;
use super::section::{Rule, Section, is_empty};
use crate::config::RegistryAuth;

const REGISTRY_RULES: &[Rule] = &[Rule {
    key: "headers",
    neutral: is_empty,
    reason: "crius has no headers for every registry: add a [header] table to the hosts.toml \
             of each registry that needs them",
}];

const MIRROR_RULES: &[Rule] = &[Rule {
    key: "rewrite",
    neutral: is_empty,
    reason: "crius has no repository rewrites",
}];

/// One deprecated `mirrors.<registry>` table.
struct Mirror {
    key: String,
    registry: String,
    endpoints: Vec<String>,
}

pub(super) fn registry_section(sec: &mut Section<'_>, layout: Layout, ctx: &mut Ctx) {
    let config_path = sec
        .string("config_path", &mut ctx.report)
        .unwrap_or_default();
    if !config_path.is_empty() {
        set_config_path(&config_path, &sec.key("config_path"), ctx);
    }
    let tls = configs(sec, layout, ctx);
    auths(sec, ctx);
    let mirrors = mirrors(sec, ctx);
    sec.unsupported(REGISTRY_RULES, &mut ctx.report);
    legacy_hosts(&config_path, mirrors, tls, ctx);
}

fn set_config_path(config_path: &str, key: &str, ctx: &mut Ctx) {
    let mut dirs = config_path.split(':').filter(|d| !d.is_empty());
    let first = dirs.next().unwrap_or_default();
    ctx.config.registry.config_path = first.to_string();
    let rest: Vec<&str> = dirs.collect();
    if !rest.is_empty() {
        ctx.report.not_carried(
            key,
            format!(
                "crius reads one hosts directory: {first:?} is used, {} not",
                rest.join(", ")
            ),
        );
    }
}

/// `configs.<host>`: the credentials go into crius's config; the TLS settings are returned.
fn configs(sec: &mut Section<'_>, layout: Layout, ctx: &mut Ctx) -> BTreeMap<String, Tls> {
    let mut tls_by_host = BTreeMap::new();
    let Some(mut configs) = sec.table("configs", &mut ctx.report) else {
        return tls_by_host;
    };
    for host in configs.unread_keys() {
        let Some(mut entry) = configs.table(&host, &mut ctx.report) else {
            continue;
        };
        if let Some(mut auth) = entry.table("auth", &mut ctx.report) {
            if let Some(credentials) = registry_auth(&mut auth, ctx) {
                let host_config = ctx.config.registry.configs.entry(host.clone()).or_default();
                host_config.auth = Some(credentials);
            }
            auth.finish(&mut ctx.report);
        }
        if let Some(mut tls) = entry.table("tls", &mut ctx.report) {
            if layout == Layout::V3 {
                ctx.report.not_carried(
                    tls.path(),
                    "containerd 2.x no longer reads TLS settings here: put them in a hosts.toml \
                     under config_path",
                );
                tls.take_all();
            } else if let Some(settings) = tls_settings(&mut tls, ctx) {
                tls_by_host.insert(host.clone(), settings);
            }
            tls.finish(&mut ctx.report);
        }
        entry.finish(&mut ctx.report);
    }
    configs.finish(&mut ctx.report);
    tls_by_host
}

/// Credentials with containerd's key names (crius uses the same); `None` when all empty.
fn registry_auth(sec: &mut Section<'_>, ctx: &mut Ctx) -> Option<RegistryAuth> {
    let mut auth = RegistryAuth::default();
    let fields: [(&str, &mut String); 4] = [
        ("username", &mut auth.username),
        ("password", &mut auth.password),
        ("auth", &mut auth.auth),
        ("identitytoken", &mut auth.identitytoken),
    ];
    for (key, field) in fields {
        if let Some(value) = sec.string(key, &mut ctx.report) {
            *field = value;
        }
    }
    (auth != RegistryAuth::default()).then_some(auth)
}

fn tls_settings(sec: &mut Section<'_>, ctx: &mut Ctx) -> Option<Tls> {
    let mut tls = Tls {
        key: sec.path().to_string(),
        ..Tls::default()
    };
    let files: [(&str, &mut Option<String>); 3] = [
        ("ca_file", &mut tls.ca),
        ("cert_file", &mut tls.cert),
        ("key_file", &mut tls.client_key),
    ];
    for (key, field) in files {
        let Some(path) = sec.string(key, &mut ctx.report).filter(|p| !p.is_empty()) else {
            continue;
        };
        if !std::path::Path::new(&path).is_absolute() {
            ctx.report.not_carried(
                sec.key(key),
                format!("{path:?} is relative: hosts.toml paths are read relative to the host's directory, containerd read this one relative to its working directory"),
            );
            return None;
        }
        *field = Some(path);
    }
    tls.skip_verify = sec
        .bool("insecure_skip_verify", &mut ctx.report)
        .unwrap_or(false);
    if tls.client_key.is_some() && tls.cert.is_none() {
        ctx.report
            .not_carried(sec.path(), "key_file is set without cert_file");
        return None;
    }
    (!tls.is_empty()).then_some(tls)
}

/// The deprecated `auths."<url>"`: carried over as `[registry.configs."<host>".auth]`.
fn auths(sec: &mut Section<'_>, ctx: &mut Ctx) {
    let Some(mut auths) = sec.table("auths", &mut ctx.report) else {
        return;
    };
    for url in auths.unread_keys() {
        let Some(mut entry) = auths.table(&url, &mut ctx.report) else {
            continue;
        };
        let host = url_host(&url).to_string();
        if let Some(credentials) = registry_auth(&mut entry, ctx) {
            let host_config = ctx.config.registry.configs.entry(host.clone()).or_default();
            if host_config.auth.is_some() {
                ctx.report.not_carried(
                    entry.path(),
                    format!("configs.{host:?}.auth is set too, and wins"),
                );
            } else {
                host_config.auth = Some(credentials);
                ctx.report.note(
                    entry.path(),
                    format!("deprecated: carried over as [registry.configs.{host:?}.auth]"),
                );
            }
        }
        entry.finish(&mut ctx.report);
    }
    auths.finish(&mut ctx.report);
}

/// `https://host[:port]/path` → `host[:port]`.
fn url_host(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.split('/').next().unwrap_or(rest)
}

fn mirrors(sec: &mut Section<'_>, ctx: &mut Ctx) -> Vec<Mirror> {
    let mut found = Vec::new();
    let Some(mut mirrors) = sec.table("mirrors", &mut ctx.report) else {
        return found;
    };
    for registry in mirrors.unread_keys() {
        let Some(mut entry) = mirrors.table(&registry, &mut ctx.report) else {
            continue;
        };
        let endpoints = entry
            .strings("endpoint", &mut ctx.report)
            .unwrap_or_default();
        entry.unsupported(MIRROR_RULES, &mut ctx.report);
        if !endpoints.is_empty() {
            found.push(Mirror {
                key: entry.path().to_string(),
                registry: registry.clone(),
                endpoints,
            });
        }
        entry.finish(&mut ctx.report);
    }
    mirrors.finish(&mut ctx.report);
    found
}

/// Turns the deprecated mirrors and TLS settings into hosts files when it may.
fn legacy_hosts(
    config_path: &str,
    mirrors: Vec<Mirror>,
    tls: BTreeMap<String, Tls>,
    ctx: &mut Ctx,
) {
    let keys: Vec<String> = mirrors
        .iter()
        .map(|m| m.key.clone())
        .chain(tls.values().map(|t| t.key.clone()))
        .collect();
    if keys.is_empty() {
        return;
    }
    let refusal = if !config_path.is_empty() {
        Some(
            "containerd refuses it together with config_path: add it to a hosts.toml in that directory",
        )
    } else {
        match ctx.hosts_dir.as_ref().map(|d| d.to_str()) {
            None => Some(
                "crius reads registry mirrors and TLS settings from hosts.toml files only: \
                 run again with --hosts-dir DIR to have them written there",
            ),
            Some(None) => {
                Some("the --hosts-dir path is not UTF-8 text, which registry.config_path must be")
            }
            Some(Some(_)) => None,
        }
    };
    if let Some(reason) = refusal {
        for key in keys {
            ctx.report.not_carried(key, reason);
        }
        return;
    }
    let plans = plan_hosts(mirrors, tls, ctx);
    let files = hosts::files(&plans, &mut ctx.report);
    if let (false, Some(dir)) = (
        files.is_empty(),
        ctx.hosts_dir.as_ref().and_then(|d| d.to_str()),
    ) {
        ctx.config.registry.config_path = dir.to_string();
        ctx.hosts_files = files;
    }
}

/// One hosts.toml per registry with mirrors and per host with TLS settings.
fn plan_hosts(mirrors: Vec<Mirror>, tls: BTreeMap<String, Tls>, ctx: &mut Ctx) -> Vec<HostPlan> {
    let mut plans: BTreeMap<String, HostPlan> = BTreeMap::new();
    for mirror in mirrors {
        let dir = if mirror.registry == "*" {
            "_default"
        } else {
            mirror.registry.as_str()
        };
        if !hosts::valid_dir_name(dir) {
            ctx.report.not_carried(
                mirror.key,
                "not a host name a hosts directory can be named after",
            );
            continue;
        }
        let plan = plans
            .entry(dir.to_string())
            .or_insert_with(|| HostPlan::new(dir));
        for endpoint in &mirror.endpoints {
            if let Err(reason) = plan.add_mirror(endpoint) {
                ctx.report
                    .not_carried(format!("{}.endpoint", mirror.key), reason);
            }
        }
    }
    for (host, settings) in &tls {
        if hosts::valid_dir_name(host) {
            plans
                .entry(host.clone())
                .or_insert_with(|| HostPlan::new(host));
        } else {
            ctx.report.not_carried(
                settings.key.clone(),
                "not a host name a hosts directory can be named after",
            );
        }
    }
    let mut plans: Vec<HostPlan> = plans.into_values().collect();
    for plan in &mut plans {
        plan.attach_tls(&tls);
    }
    plans
}
