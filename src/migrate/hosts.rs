//! containerd-style `<dir>/<host>/hosts.toml` files for the deprecated registry mirrors and
//! TLS settings, in the format crius's registry code reads (`crate::image::hosts`), and the
//! writer that puts them on disk without following symlinks or replacing a file.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, open, openat};
use nix::sys::stat::{Mode, mkdirat};
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

/// A mirror endpoint: `scheme://host[:port]` and its path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MirrorPlan {
    base: String,
    host: String,
    path: String,
    tls: Option<Tls>,
}

/// What one hosts.toml will say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostPlan {
    dir: String,
    /// The upstream registry; none for `_default` (each registry is its own upstream).
    server: Option<String>,
    tls: Option<Tls>,
    mirrors: Vec<MirrorPlan>,
}

impl HostPlan {
    pub(crate) fn new(dir: &str) -> Self {
        let server = match dir {
            "_default" => None,
            "docker.io" => Some("https://registry-1.docker.io".to_string()),
            host if crate::image::hosts::is_local(host) => Some(format!("http://{host}")),
            host => Some(format!("https://{host}")),
        };
        Self {
            dir: dir.to_string(),
            server,
            tls: None,
            mirrors: Vec::new(),
        }
    }

    /// Adds a deprecated mirror endpoint, tried before the upstream as containerd did.
    pub(crate) fn add_mirror(&mut self, endpoint: &str) -> Result<(), String> {
        let mirror = parse_endpoint(endpoint)?;
        let upstream = self.server.as_deref() == Some(mirror.base.as_str())
            && (mirror.path.is_empty() || mirror.path == "/v2");
        if !upstream && !self.mirrors.contains(&mirror) {
            self.mirrors.push(mirror);
        }
        Ok(())
    }

    /// Gives the upstream and every mirror the TLS settings of their host.
    pub(crate) fn attach_tls(&mut self, tls: &BTreeMap<String, Tls>) {
        self.tls = tls.get(&self.dir).cloned();
        for mirror in &mut self.mirrors {
            mirror.tls = tls.get(&mirror.host).cloned();
        }
    }

    fn to_table(&self) -> Table {
        let mut table = Table::new();
        if let Some(server) = &self.server {
            table.insert("server".into(), Value::String(server.clone()));
        }
        if let Some(tls) = &self.tls {
            tls.write_into(&mut table);
        }
        let mut hosts = Table::new();
        for mirror in &self.mirrors {
            let mut host = Table::new();
            let capabilities = ["pull", "resolve"].map(|c| Value::String(c.into()));
            host.insert("capabilities".into(), Value::Array(capabilities.to_vec()));
            // containerd used a mirror's path as it was; hosts.toml adds /v2 unless told.
            if !mirror.path.is_empty() && !mirror.path.ends_with("/v2") {
                host.insert("override_path".into(), Value::Boolean(true));
            }
            if let Some(tls) = &mirror.tls {
                tls.write_into(&mut host);
            }
            hosts.insert(
                format!("{}{}", mirror.base, mirror.path),
                Value::Table(host),
            );
        }
        if !hosts.is_empty() {
            table.insert("host".into(), Value::Table(hosts));
        }
        table
    }
}

/// A deprecated mirror endpoint, with containerd's default scheme when it has none (plain
/// HTTP for this machine, else HTTPS).
fn parse_endpoint(endpoint: &str) -> Result<MirrorPlan, String> {
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
    Ok(MirrorPlan {
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
/// symlink is followed below `dir`, and `dir` itself must not be one.
pub fn write_hosts_files(dir: &Path, files: &[HostsFile]) -> Result<Vec<PathBuf>, MigrateError> {
    let dir_error = |reason: String| MigrateError::HostsDir {
        path: dir.to_path_buf(),
        reason,
    };
    for file in files {
        if !valid_dir_name(&file.host) {
            return Err(dir_error(format!("{:?} is not a host name", file.host)));
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
    std::fs::create_dir_all(dir).map_err(|e| dir_error(e.to_string()))?;
    let root = open_dir(dir).map_err(|e| dir_error(describe(e, "a directory")))?;
    let mut written = Vec::new();
    for file in files {
        let path = dir.join(&file.host).join(HOSTS_FILE);
        write_one(&root, file, &path)?;
        written.push(path);
    }
    Ok(written)
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

fn write_one(root: &OwnedFd, file: &HostsFile, path: &Path) -> Result<(), MigrateError> {
    let host_dir = path.parent().unwrap_or(path).to_path_buf();
    let write_error = |errno: Errno, at: &Path| MigrateError::Write {
        path: at.to_path_buf(),
        source: std::io::Error::from(errno),
    };
    match mkdirat(root, file.host.as_str(), Mode::from_bits_truncate(0o755)) {
        Ok(()) | Err(Errno::EEXIST) => {}
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
    let mut out = std::fs::File::from(fd);
    let result = out
        .set_permissions(std::fs::Permissions::from_mode(0o644))
        .and_then(|()| out.write_all(file.text.as_bytes()))
        .and_then(|()| out.sync_all());
    if let Err(source) = result {
        let _ = nix::unistd::unlinkat(&sub, HOSTS_FILE, nix::unistd::UnlinkatFlags::NoRemoveDir);
        return Err(MigrateError::Write {
            path: path.to_path_buf(),
            source,
        });
    }
    Ok(())
}
