//! `crius config migrate`: containerd's CRI plugin settings, read from a containerd
//! `config.toml`, turned into the equivalent crius config.
//!
//! All three containerd config layouts are read: version 1 (no `version` key; the plugin is
//! `plugins.cri`), version 2 (containerd 1.x: `plugins."io.containerd.grpc.v1.cri"`) and
//! version 3 (containerd 2.x: `io.containerd.cri.v1.runtime`, `io.containerd.cri.v1.images`
//! and the stream server keys left in `io.containerd.grpc.v1.cri`). Every key is either
//! carried over onto a crius key, or reported with the reason it is not; a value at which
//! crius already behaves as containerd would needs no report.
//!
//! The deprecated registry `mirrors` and `configs.<host>.tls` become containerd-style
//! `<dir>/<host>/hosts.toml` files (which crius reads through `registry.config_path`);
//! `configs.<host>.auth` becomes crius's `[registry.configs."<host>".auth]`.

mod duration;
mod hosts;
mod layout;
mod registry;
mod render;
mod report;
mod runtimes;
mod section;
mod settings;

#[cfg(test)]
mod tests;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::config::{Config, ConfigError};

pub use hosts::{HostsFile, write_hosts_files};
pub use report::{Note, NoteKind, Report};

/// containerd config files larger than this are refused.
pub const MAX_SOURCE_BYTES: u64 = 4 * 1024 * 1024;

/// Why a migration failed (a key that cannot be carried over is not a failure: it is
/// reported in the [`Report`]).
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is larger than {limit} bytes: not a containerd config file")]
    TooLarge { path: PathBuf, limit: u64 },
    #[error("{path} is not a TOML file: {message}")]
    NotToml { path: PathBuf, message: String },
    #[error(
        "{path}: unknown containerd config version {version} (versions 1 to 4 can be migrated)"
    )]
    UnknownVersion { path: PathBuf, version: String },
    #[error("the migrated config does not load in crius: {0}")]
    Invalid(#[from] ConfigError),
    #[error("--hosts-dir {path}: {reason}")]
    HostsDir { path: PathBuf, reason: String },
    #[error("refusing to overwrite {path}: it already exists")]
    HostsFileExists { path: PathBuf },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write the migrated config: {0}")]
    Output(std::io::Error),
    #[error("cannot render the migrated config: {0}")]
    Render(String),
}

/// Where the containerd config comes from and where hosts files may go.
#[derive(Debug, Clone, Copy)]
pub struct Options<'a> {
    /// The containerd config file (named in the output's header and in errors).
    pub source: &'a Path,
    /// The directory for the `hosts.toml` files the deprecated registry mirrors and TLS
    /// settings become; without it they are reported as not carried over.
    pub hosts_dir: Option<&'a Path>,
}

/// The result of reading one containerd config.
#[derive(Debug, Clone)]
pub struct Migration {
    /// The crius config, validated.
    pub config: Config,
    pub report: Report,
    /// The `hosts.toml` files to write under the hosts directory.
    pub hosts_files: Vec<HostsFile>,
    /// The containerd config version read (1, 2 or 3).
    pub version: i64,
    source: PathBuf,
    hosts_dir: Option<PathBuf>,
}

impl Migration {
    /// The crius config file: a header saying where it came from, then every setting that
    /// differs from crius's defaults.
    pub fn to_toml(&self) -> Result<String, MigrateError> {
        render::render(self)
    }
}

/// Reads the containerd config at `path`, refusing files over [`MAX_SOURCE_BYTES`].
pub fn read_source(path: &Path) -> Result<String, MigrateError> {
    let read_error = |source| MigrateError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_error)?;
    let mut bytes = Vec::new();
    file.take(MAX_SOURCE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read_error)?;
    if bytes.len() as u64 > MAX_SOURCE_BYTES {
        return Err(MigrateError::TooLarge {
            path: path.to_path_buf(),
            limit: MAX_SOURCE_BYTES,
        });
    }
    String::from_utf8(bytes).map_err(|e| MigrateError::NotToml {
        path: path.to_path_buf(),
        message: format!("not UTF-8 text: {e}"),
    })
}

/// Migrates the text of a containerd config. The result is checked to load in crius.
pub fn migrate(text: &str, options: &Options<'_>) -> Result<Migration, MigrateError> {
    let document: toml::Table = toml::from_str(text).map_err(|e| MigrateError::NotToml {
        path: options.source.to_path_buf(),
        message: e.to_string(),
    })?;
    let hosts_dir = options
        .hosts_dir
        .map(|dir| {
            std::path::absolute(dir).map_err(|e| MigrateError::HostsDir {
                path: dir.to_path_buf(),
                reason: e.to_string(),
            })
        })
        .transpose()?;
    let mut ctx = Ctx::new(hosts_dir.clone());
    let version = layout::migrate_document(&document, options.source, &mut ctx)?;
    let migration = Migration {
        config: ctx.config,
        report: ctx.report,
        hosts_files: ctx.hosts_files,
        version,
        source: options.source.to_path_buf(),
        hosts_dir,
    };
    Config::from_toml_str(&migration.to_toml()?)?;
    Ok(migration)
}

/// `crius config migrate`: reads `from`, writes the hosts files (when there are any and
/// `hosts_dir` is given), prints the crius config to `out` and the report to `err`.
pub fn run(
    from: &Path,
    hosts_dir: Option<&Path>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), MigrateError> {
    let text = read_source(from)?;
    let migration = migrate(
        &text,
        &Options {
            source: from,
            hosts_dir,
        },
    )?;
    let written = match &migration.hosts_dir {
        Some(dir) if !migration.hosts_files.is_empty() => {
            write_hosts_files(dir, &migration.hosts_files)?
        }
        _ => Vec::new(),
    };
    let text = migration.to_toml()?;
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(MigrateError::Output)?;
    print_report(&migration, &written, err).map_err(MigrateError::Output)
}

fn print_report(
    migration: &Migration,
    written: &[PathBuf],
    err: &mut dyn Write,
) -> std::io::Result<()> {
    for note in &migration.report.notes {
        writeln!(err, "{note}")?;
    }
    for path in written {
        writeln!(err, "wrote {}", path.display())?;
    }
    let has_secrets = migration
        .config
        .registry
        .configs
        .values()
        .any(|host| host.auth.is_some());
    if has_secrets {
        writeln!(
            err,
            "the migrated config holds registry credentials: keep the file readable by root only (mode 0600)"
        )?;
    }
    let skipped = migration.report.not_carried_keys().len();
    writeln!(
        err,
        "migrated {} (containerd config version {}): {skipped} setting(s) not carried over",
        migration.source.display(),
        migration.version
    )
}

/// The state of one migration while the containerd config is read.
pub(crate) struct Ctx {
    pub config: Config,
    pub report: Report,
    /// Absolute; `None` when no `--hosts-dir` was given.
    pub hosts_dir: Option<PathBuf>,
    pub hosts_files: Vec<HostsFile>,
    pub runtimes: runtimes::Runtimes,
}

impl Ctx {
    fn new(hosts_dir: Option<PathBuf>) -> Self {
        Self {
            config: Config::default(),
            report: Report::default(),
            hosts_dir,
            hosts_files: Vec::new(),
            runtimes: runtimes::Runtimes::default(),
        }
    }
}
