//! containerd-style `<dir>/<host>/hosts.toml` files for the deprecated registry mirrors and
//! TLS settings, in the format crius's registry code reads (`crate::image::hosts`), and the
//! writer that puts them on disk without following symlinks or replacing a file.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, open, openat};
use nix::sys::stat::{Mode, mkdirat};
use nix::unistd::{UnlinkatFlags, unlinkat};
use toml::{Table, Value};

use super::MigrateError;
use super::report::Report;

/// The file each host directory holds.
const HOSTS_FILE: &str = "hosts.toml";

/// One hosts file to write: `<dir>/<host>/hosts.toml`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostsFile {
    /// The directory name: `host[:port]`, or `_default` for every registry.
    pub host: String,
    pub text: String,
}

/// The deprecated `configs.<host>.tls` settings of one host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Tls {
    /// The key they were read from, for the report.
    pub key: String,
    pub ca: Option<String>,
    pub cert: Option<String>,
    pub client_key: Option<String>,
    pub skip_verify: bool,
}

impl Tls {
    pub(crate) fn is_empty(&self) -> bool {
        self.ca.is_none() && self.cert.is_none() && !self.skip_verify
    }

    fn write_into(&self, table: &mut Table) {
        if let Some(ca) = &self.ca {
            table.insert("ca".into(), Value::String(ca.clone()));
        }
        match (&self.cert, &self.client_key) {
            (Some(cert), Some(key)) => {
                let pair = vec![Value::String(cert.clone()), Value::String(key.clone())];
                table.insert("client".into(), Value::Array(vec![Value::Array(pair)]));
            }
            (Some(cert), None) => {
                table.insert("client".into(), Value::String(cert.clone()));
            }
            _ => {}
        }
        if self.skip_verify {
            table.insert("skip_verify".into(), Value::Boolean(true));
        }
    }
}

/// One endpoint containerd tried for a registry: `scheme://host[:port]` and its path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    base: String,
    /// `host[:port]`: containerd looked up `configs.<host>.tls` by it.
    host: String,
    path: String,
    tls: Option<Tls>,
}

impl Endpoint {
    pub(crate) fn host(&self) -> &str {
        &self.host
    }

    /// The URL it is written as.
    pub(crate) fn url(&self) -> String {
        format!("{}{}", self.base, self.path)
    }

    /// Whether both reach the same API root (containerd used `/v2` for an empty path).
    fn same_as(&self, other: &Endpoint) -> bool {
        let api = |path: &str| if path.is_empty() { "/v2" } else { path }.to_string();
        self.base == other.base && api(&self.path) == api(&other.path)
    }

    /// containerd used a path as it was; hosts.toml adds `/v2` unless told not to.
    fn needs_override_path(&self) -> bool {
        !self.path.is_empty() && !self.path.ends_with("/v2")
    }
}

/// The endpoint containerd appended for `registry` (Docker Hub's is registry-1.docker.io;
/// this machine's are plain HTTP).
fn default_endpoint(registry: &str) -> Endpoint {
    let host = if registry == "docker.io" {
        "registry-1.docker.io"
    } else {
        registry
    };
    let scheme = if crate::image::hosts::is_local(host) {
        "http"
    } else {
        "https"
    };
    Endpoint {
        base: format!("{scheme}://{host}"),
        host: host.to_string(),
        path: String::new(),
        tls: None,
    }
}

/// What one hosts.toml will say: `[host]` entries tried in order, then `server`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostPlan {
    dir: String,
    /// Tried last; none for `_default` (each registry is its own upstream there).
    server: Option<Endpoint>,
    hosts: Vec<Endpoint>,
}

impl HostPlan {
    /// `_default`: the `mirrors."*"` endpoints, then each registry's default endpoint.
    pub(crate) fn catch_all(endpoints: &[Endpoint]) -> Self {
        let mut plan = Self {
            dir: "_default".to_string(),
            server: None,
            hosts: Vec::new(),
        };
        for endpoint in endpoints {
            plan.push_host(endpoint.clone());
        }
        plan
    }

    /// containerd's list for `registry`: `endpoints` in order, then the registry's default
    /// endpoint unless one of them is on the registry's own host. The last becomes
    /// `server`, the others `[host]` entries, so the order is containerd's.
    pub(crate) fn registry(registry: &str, endpoints: &[Endpoint]) -> Self {
        let mut list = endpoints.to_vec();
        if !list.iter().any(|e| e.host == registry) {
            list.push(default_endpoint(registry));
        }
        // Trying an endpoint again right after it failed changes nothing.
        list.dedup_by(|next, previous| next.same_as(previous));
        let server = list.pop();
        let mut plan = Self {
            dir: registry.to_string(),
            server,
            hosts: Vec::new(),
        };
        for endpoint in list {
            plan.push_host(endpoint);
        }
        plan
    }

    /// Adds a `[host]` entry; a repeat of an earlier one (a retry) is left out.
    fn push_host(&mut self, endpoint: Endpoint) {
        if !self.hosts.iter().any(|h| h.same_as(&endpoint)) {
            self.hosts.push(endpoint);
        }
    }

    /// Gives every endpoint the TLS settings of its own host, as containerd looked them
    /// up (`configs.<endpoint host>.tls`); the hosts given some are added to `used`.
    pub(crate) fn attach_tls(&mut self, tls: &BTreeMap<String, Tls>, used: &mut BTreeSet<String>) {
        for endpoint in self.hosts.iter_mut().chain(self.server.iter_mut()) {
            endpoint.tls = tls.get(&endpoint.host).cloned();
            if endpoint.tls.is_some() {
                used.insert(endpoint.host.clone());
            }
        }
    }

    fn to_table(&self) -> Table {
        let mut table = Table::new();
        if let Some(server) = &self.server {
            table.insert("server".into(), Value::String(server.url()));
            if server.needs_override_path() {
                table.insert("override_path".into(), Value::Boolean(true));
            }
            if let Some(tls) = &server.tls {
                tls.write_into(&mut table);
            }
        }
        let mut hosts = Table::new();
        for endpoint in &self.hosts {
            let mut host = Table::new();
            let capabilities = ["pull", "resolve"].map(|c| Value::String(c.into()));
            host.insert("capabilities".into(), Value::Array(capabilities.to_vec()));
            if endpoint.needs_override_path() {
                host.insert("override_path".into(), Value::Boolean(true));
            }
            if let Some(tls) = &endpoint.tls {
                tls.write_into(&mut host);
            }
            hosts.insert(endpoint.url(), Value::Table(host));
        }
        if !hosts.is_empty() {
            table.insert("host".into(), Value::Table(hosts));
        }
        table
    }
}

/// A deprecated mirror endpoint, with containerd's default scheme when it has none (plain
/// HTTP for this machine, else HTTPS).
pub(crate) fn parse_endpoint(endpoint: &str) -> Result<Endpoint, String> {
    let with_scheme = if endpoint.contains("://") {
        endpoint.to_string()
    } else {
        let host = endpoint.split('/').next().unwrap_or(endpoint);
        let scheme = if crate::image::hosts::is_local(host) {
            "http"
        } else {
            "https"
        };
        format!("{scheme}://{endpoint}")
    };
    let (scheme, rest) = with_scheme
        .split_once("://")
        .ok_or_else(|| format!("{endpoint:?} is not a URL"))?;
    if scheme != "http" && scheme != "https" {
        return Err(format!(
            "{endpoint:?}: only http:// and https:// mirrors can be carried over"
        ));
    }
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    if host.is_empty() || host.contains(['?', '#', '@']) {
        return Err(format!("{endpoint:?} has no usable host"));
    }
    Ok(Endpoint {
        base: format!("{scheme}://{host}"),
        host: host.to_string(),
        path: path.trim_end_matches('/').to_string(),
        tls: None,
    })
}

/// Whether `name` can be a directory under the hosts dir: a `host[:port]` (IPv6 in
/// brackets) or `_default`, never a path.
pub(crate) fn valid_dir_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name.len() <= 255
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._:[]".contains(&b))
}

/// The hosts files for `plans`; a plan whose text cannot be made is reported instead.
pub(crate) fn files(plans: &[HostPlan], report: &mut Report) -> Vec<HostsFile> {
    let mut files = Vec::new();
    for plan in plans {
        match toml::to_string(&plan.to_table()) {
            Ok(body) => files.push(HostsFile {
                host: plan.dir.clone(),
                text: format!(
                    "# Written by `crius config migrate` from the deprecated registry mirrors and\n\
                     # TLS settings of containerd's CRI plugin.\n{body}"
                ),
            }),
            Err(e) => report.not_carried(format!("hosts file for {}", plan.dir), e.to_string()),
        }
    }
    files
}

/// Writes `files` as `<dir>/<host>/hosts.toml` (mode 0644: they hold no secrets), creating
/// `dir` and the host directories. Nothing is written when any file exists already; no
/// symlink is followed below `dir`, and `dir` itself must not be one. When a write fails,
/// the files and directories this call created are removed again, so that it can be rerun.
pub fn write_hosts_files(dir: &Path, files: &[HostsFile]) -> Result<Vec<PathBuf>, MigrateError> {
    check_targets(dir, files)?;
    let mut created = Created {
        dirs: missing_dirs(dir),
        ..Created::default()
    };
    let result = write_all(dir, files, &mut created);
    if result.is_err() {
        created.undo();
    }
    result
}

/// Refuses before anything is written: a bad host name, a symlinked host directory, or a
/// hosts file (or anything else by its name) that exists already.
fn check_targets(dir: &Path, files: &[HostsFile]) -> Result<(), MigrateError> {
    for file in files {
        if !valid_dir_name(&file.host) {
            return Err(MigrateError::HostsDir {
                path: dir.to_path_buf(),
                reason: format!("{:?} is not a host name", file.host),
            });
        }
        let host_dir = dir.join(&file.host);
        if host_dir.is_symlink() {
            return Err(MigrateError::HostsDir {
                path: host_dir,
                reason: "is a symlink, which is not followed".to_string(),
            });
        }
        let path = host_dir.join(HOSTS_FILE);
        if path.symlink_metadata().is_ok() {
            return Err(MigrateError::HostsFileExists { path });
        }
    }
    Ok(())
}

fn write_all(
    dir: &Path,
    files: &[HostsFile],
    created: &mut Created,
) -> Result<Vec<PathBuf>, MigrateError> {
    let dir_error = |reason: String| MigrateError::HostsDir {
        path: dir.to_path_buf(),
        reason,
    };
    std::fs::create_dir_all(dir).map_err(|e| dir_error(e.to_string()))?;
    let root = open_dir(dir).map_err(|e| dir_error(describe(e, "a directory")))?;
    let mut written = Vec::new();
    let result = files.iter().try_for_each(|file| {
        let path = dir.join(&file.host).join(HOSTS_FILE);
        write_one(&root, file, &path, created)?;
        written.push(path);
        Ok(())
    });
    created.root = Some(root);
    result.map(|()| written)
}

/// The directories `create_dir_all(dir)` is about to make, outermost first.
fn missing_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut missing = Vec::new();
    let mut at = Some(dir);
    while let Some(path) = at {
        if path.as_os_str().is_empty() || path.symlink_metadata().is_ok() {
            break;
        }
        missing.push(path.to_path_buf());
        at = path.parent();
    }
    missing.reverse();
    missing
}

/// What one call of [`write_hosts_files`] created, to be removed if a later step fails.
#[derive(Default)]
struct Created {
    /// `dir` and the parents it lacked, outermost first.
    dirs: Vec<PathBuf>,
    /// `dir`, once open.
    root: Option<OwnedFd>,
    /// The host directories made below `dir`.
    host_dirs: Vec<String>,
    /// The open host directories a hosts file was created in.
    files: Vec<OwnedFd>,
}

impl Created {
    /// Best effort: what cannot be removed (a directory someone else wrote into since)
    /// stays, and the error that caused the undo is the one reported.
    fn undo(self) {
        for host_dir in &self.files {
            let _ = unlinkat(host_dir, HOSTS_FILE, UnlinkatFlags::NoRemoveDir);
        }
        if let Some(root) = &self.root {
            for host in self.host_dirs.iter().rev() {
                let _ = unlinkat(root, host.as_str(), UnlinkatFlags::RemoveDir);
            }
        }
        drop(self.root);
        for dir in self.dirs.iter().rev() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

fn describe(errno: Errno, what: &str) -> String {
    match errno {
        Errno::ELOOP | Errno::ENOTDIR => format!("not {what} (a symlink is not followed)"),
        other => other.desc().to_string(),
    }
}

fn open_dir(dir: &Path) -> Result<OwnedFd, Errno> {
    open(
        dir,
        OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY,
        Mode::empty(),
    )
}

fn write_one(
    root: &OwnedFd,
    file: &HostsFile,
    path: &Path,
    created: &mut Created,
) -> Result<(), MigrateError> {
    let host_dir = path.parent().unwrap_or(path).to_path_buf();
    let write_error = |errno: Errno, at: &Path| MigrateError::Write {
        path: at.to_path_buf(),
        source: std::io::Error::from(errno),
    };
    match mkdirat(root, file.host.as_str(), Mode::from_bits_truncate(0o755)) {
        Ok(()) => created.host_dirs.push(file.host.clone()),
        Err(Errno::EEXIST) => {}
        Err(e) => return Err(write_error(e, &host_dir)),
    }
    let sub = openat(
        root,
        file.host.as_str(),
        OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY,
        Mode::empty(),
    )
    .map_err(|e| MigrateError::HostsDir {
        path: host_dir.clone(),
        reason: describe(e, "a directory"),
    })?;
    let fd = openat(
        &sub,
        HOSTS_FILE,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o644),
    )
    .map_err(|e| match e {
        Errno::EEXIST => MigrateError::HostsFileExists {
            path: path.to_path_buf(),
        },
        other => write_error(other, path),
    })?;
    // O_EXCL made the file ours: an undo may remove it.
    created.files.push(sub);
    let mut out = std::fs::File::from(fd);
    out.set_permissions(std::fs::Permissions::from_mode(0o644))
        .and_then(|()| out.write_all(file.text.as_bytes()))
        .and_then(|()| out.sync_all())
        .map_err(|source| MigrateError::Write {
            path: path.to_path_buf(),
            source,
        })
}
