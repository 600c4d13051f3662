//! The CRI plugin's `registry` table: `config_path`, credentials, and the deprecated
//! `mirrors` and `configs.<host>.tls`, which become hosts.toml files.

use std::collections::{BTreeMap, BTreeSet};

use super::Ctx;
use super::hosts::{self, Endpoint, HostPlan, Tls};
use super::layout::Layout;
use super::section::{Rule, Section, is_empty};
use crate::config::{RegistryAuth, RegistryHostConfig};

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
    let configs = configs(sec, layout, ctx);
    auths(sec, &configs.auth_keys, ctx);
    let mirrors = mirrors(sec, ctx);
    sec.unsupported(REGISTRY_RULES, &mut ctx.report);
    legacy_hosts(&config_path, mirrors, configs.tls, ctx);
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

/// What `configs.<host>` held besides the credentials carried over.
#[derive(Default)]
struct Configs {
    /// The TLS settings by host.
    tls: BTreeMap<String, Tls>,
    /// The key of each host's carried credentials (an `auths` entry may replace them).
    auth_keys: BTreeMap<String, String>,
}

/// `configs.<host>`: the credentials go into crius's config; the TLS settings are returned.
fn configs(sec: &mut Section<'_>, layout: Layout, ctx: &mut Ctx) -> Configs {
    let mut found = Configs::default();
    let Some(mut configs) = sec.table("configs", &mut ctx.report) else {
        return found;
    };
    for host in configs.unread_keys() {
        let Some(mut entry) = configs.table(&host, &mut ctx.report) else {
            continue;
        };
        if let Some(mut auth) = entry.table("auth", &mut ctx.report) {
            if let Some(credentials) = registry_auth(&mut auth, ctx) {
                let host_config = ctx.config.registry.configs.entry(host.clone()).or_default();
                host_config.auth = Some(credentials);
                found
                    .auth_keys
                    .insert(host.clone(), auth.path().to_string());
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
                found.tls.insert(host.clone(), settings);
            }
            tls.finish(&mut ctx.report);
        }
        entry.finish(&mut ctx.report);
    }
    configs.finish(&mut ctx.report);
    found
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
/// containerd let an entry replace the `configs.<host>.auth` of the same host.
fn auths(sec: &mut Section<'_>, config_auths: &BTreeMap<String, String>, ctx: &mut Ctx) {
    let Some(mut auths) = sec.table("auths", &mut ctx.report) else {
        return;
    };
    let mut taken: BTreeMap<String, String> = BTreeMap::new();
    for url in auths.unread_keys() {
        let Some(mut entry) = auths.table(&url, &mut ctx.report) else {
            continue;
        };
        let credentials = registry_auth(&mut entry, ctx);
        let key = entry.path().to_string();
        entry.finish(&mut ctx.report);
        let host = match auth_host(&url) {
            Ok(host) => host,
            Err(reason) => {
                ctx.report.not_carried(key, reason);
                continue;
            }
        };
        if let Some(other) = taken.get(&host) {
            ctx.report.not_carried(
                key,
                format!(
                    "{other} names the same host {host:?}, and containerd kept whichever of \
                     the two its map order gave last: only that one is carried over"
                ),
            );
            continue;
        }
        taken.insert(host.clone(), key.clone());
        replace_auth(&host, credentials, &key, config_auths, ctx);
    }
    auths.finish(&mut ctx.report);
}

/// Sets (or, for an empty entry, clears) the credentials of `host` from the `auths` entry
/// `key`, reporting the `configs.<host>.auth` it replaces.
fn replace_auth(
    host: &str,
    credentials: Option<RegistryAuth>,
    key: &str,
    config_auths: &BTreeMap<String, String>,
    ctx: &mut Ctx,
) {
    if let Some(replaced) = config_auths.get(host) {
        let empty = if credentials.is_none() {
            " (it is empty, so containerd pulled from there without credentials)"
        } else {
            ""
        };
        ctx.report.not_carried(
            replaced,
            format!("replaced by {key}{empty}: containerd let the deprecated auths entry win"),
        );
    }
    let configs = &mut ctx.config.registry.configs;
    match credentials {
        Some(credentials) => {
            configs.entry(host.to_string()).or_default().auth = Some(credentials);
            ctx.report.note(
                key,
                format!("deprecated: carried over as [registry.configs.{host:?}.auth]"),
            );
        }
        None => {
            if let Some(config) = configs.get_mut(host) {
                config.auth = None;
                if *config == RegistryHostConfig::default() {
                    configs.remove(host);
                }
            }
        }
    }
}

/// The key containerd filed an `auths` entry's credentials under, read as Go's url.Parse
/// does: the host of a URL with a scheme, else the text as it is. `Err` says why the
/// credentials never reached a registry (or why containerd refused the file).
fn auth_host(url: &str) -> Result<String, String> {
    if let Some((scheme, rest)) = go_url_scheme(url) {
        let authority = rest
            .strip_prefix("//")
            .map(|r| r.split(['/', '?', '#']).next().unwrap_or(r))
            .unwrap_or_default();
        let host = authority
            .rsplit_once('@')
            .map_or(authority, |(_, host)| host);
        if host.is_empty() {
            return Err(format!(
                "containerd read {url:?} as a URL with the scheme {scheme:?} and no host, so \
                 it never used these credentials; name the registry as \"https://{url}\" if \
                 they are meant for it"
            ));
        }
        return Ok(host.to_string());
    }
    let first_segment = url.split('/').next().unwrap_or(url);
    if first_segment.contains(':') {
        return Err(format!(
            "containerd refused to start with this key: without a scheme, a colon may not \
             come before the first slash; name the registry as \"https://{url}\""
        ));
    }
    if !hosts::valid_dir_name(url) {
        return Err(format!(
            "without a scheme containerd filed these credentials under {url:?} as it is, \
             which is no registry host, so it never used them"
        ));
    }
    Ok(url.to_string())
}

/// The scheme Go's url.Parse finds in `url` (a letter, then letters, digits, `+`, `-` or
/// `.`, before the first colon) and what follows the colon.
fn go_url_scheme(url: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = url.split_once(':')?;
    let mut chars = scheme.chars();
    let valid = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
    valid.then_some((scheme, rest))
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
        // An entry without endpoints still keeps "*" away from its registry.
        found.push(Mirror {
            key: entry.path().to_string(),
            registry: registry.clone(),
            endpoints,
        });
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
        .filter(|m| !m.endpoints.is_empty())
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
    let plans = plan_hosts(mirrors, &tls, ctx);
    let files = hosts::files(&plans, &mut ctx.report);
    if let (false, Some(dir)) = (
        files.is_empty(),
        ctx.hosts_dir.as_ref().and_then(|d| d.to_str()),
    ) {
        ctx.config.registry.config_path = dir.to_string();
        ctx.hosts_files = files;
    }
}

/// One hosts.toml per registry with mirrors, per registry reached on a host with TLS
/// settings, and `_default` for `mirrors."*"`, each listing the endpoints containerd tried.
fn plan_hosts(mirrors: Vec<Mirror>, tls: &BTreeMap<String, Tls>, ctx: &mut Ctx) -> Vec<HostPlan> {
    let mut own: BTreeMap<String, Vec<Endpoint>> = BTreeMap::new();
    let mut catch_all: Option<Vec<Endpoint>> = None;
    for mirror in mirrors {
        let endpoints = parse_endpoints(&mirror, ctx);
        if mirror.registry == "*" {
            catch_all = Some(endpoints);
        } else if hosts::valid_dir_name(&mirror.registry) {
            note_order(&mirror, &endpoints, ctx);
            own.insert(mirror.registry, endpoints);
        } else {
            ctx.report.not_carried(
                mirror.key,
                "not a host name a hosts directory can be named after",
            );
        }
    }
    let with_tls = tls_registries(tls, ctx);
    let mut plans: BTreeMap<String, HostPlan> = BTreeMap::new();
    if let Some(endpoints) = &catch_all {
        plans.insert("_default".into(), HostPlan::catch_all(endpoints));
    }
    for (registry, endpoints) in &own {
        // Without endpoints the file only keeps "*" away, or carries TLS settings.
        if !endpoints.is_empty() || catch_all.is_some() || with_tls.contains(registry) {
            plans.insert(registry.clone(), HostPlan::registry(registry, endpoints));
        }
    }
    // A registry without a mirrors entry of its own: containerd gave it the "*" endpoints,
    // which its own directory must list again, as it hides _default.
    let inherited = catch_all.as_deref().unwrap_or_default();
    for registry in with_tls {
        if !own.contains_key(&registry) {
            let plan = HostPlan::registry(&registry, inherited);
            plans.insert(registry, plan);
        }
    }
    let mut used = BTreeSet::new();
    let mut plans: Vec<HostPlan> = plans.into_values().collect();
    for plan in &mut plans {
        plan.attach_tls(tls, &mut used);
    }
    for (host, settings) in tls {
        if hosts::valid_dir_name(host) && !used.contains(host) {
            ctx.report.not_carried(
                settings.key.clone(),
                format!(
                    "containerd applied it only to endpoints on the host {host:?}, and no \
                     registry was reached there (Docker Hub's endpoint is registry-1.docker.io)"
                ),
            );
        }
    }
    plans
}

/// A mirror's endpoints; one that cannot be carried over is reported and left out.
fn parse_endpoints(mirror: &Mirror, ctx: &mut Ctx) -> Vec<Endpoint> {
    let mut endpoints = Vec::new();
    for endpoint in &mirror.endpoints {
        match hosts::parse_endpoint(endpoint) {
            Ok(parsed) => endpoints.push(parsed),
            Err(reason) => ctx
                .report
                .not_carried(format!("{}.endpoint", mirror.key), reason),
        }
    }
    endpoints
}

/// containerd added no default endpoint when one named the registry itself; when other
/// endpoints follow it, the last of them (not the registry) becomes the hosts.toml server.
fn note_order(mirror: &Mirror, endpoints: &[Endpoint], ctx: &mut Ctx) {
    let Some(own) = endpoints.iter().position(|e| e.host() == mirror.registry) else {
        return;
    };
    if let Some(last) = endpoints.get(own + 1..).and_then(<[Endpoint]>::last) {
        ctx.report.note(
            format!("{}.endpoint", mirror.key),
            format!(
                "containerd tried these endpoints in order and no other: hosts.toml tries \
                 its server last, so the server is {} and {} is a [host] entry in its place",
                last.url(),
                endpoints[own].url()
            ),
        );
    }
}

/// The registries whose endpoints include a host with TLS settings by default: the host
/// itself, and Docker Hub (docker.io) for registry-1.docker.io.
fn tls_registries(tls: &BTreeMap<String, Tls>, ctx: &mut Ctx) -> BTreeSet<String> {
    let mut registries = BTreeSet::new();
    for (host, settings) in tls {
        if !hosts::valid_dir_name(host) {
            ctx.report.not_carried(
                settings.key.clone(),
                "not a host name a hosts directory can be named after",
            );
            continue;
        }
        // docker.io's default endpoint is registry-1.docker.io, not docker.io.
        if host != "docker.io" {
            registries.insert(host.clone());
        }
        if host == "registry-1.docker.io" {
            registries.insert("docker.io".to_string());
        }
    }
    registries
}
