//! Reading CPU, memory and process counts straight from a cgroup's files, v1 or v2.
//!
//! Reading the files is a handful of small reads per container, much cheaper than asking
//! every shim through containerd, so stats of many containers answer fast. The layout is
//! found once from `/proc/self/mountinfo`; a container's cgroup path comes from its runtime
//! spec (`/parent/id` for cgroupfs, `slice:prefix:name` for systemd).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Where the cgroup hierarchies are mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupLayout {
    /// The unified hierarchy: one mount, path relative to its root.
    V2 { mount: PathBuf, root: PathBuf },
    /// One mount per controller (`cpuacct`, `memory`, `pids`): (mount point, its root).
    V1 {
        controllers: HashMap<String, (PathBuf, PathBuf)>,
    },
}

/// What a cgroup has used.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CgroupUsage {
    /// Cumulative CPU time in nanoseconds.
    pub cpu_usage_ns: Option<u64>,
    pub memory: Option<MemoryUsage>,
    /// Processes (tasks) in the cgroup.
    pub pids: Option<u64>,
    /// Pressure stall information (cgroup v2 only: `cpu.pressure`, `memory.pressure`,
    /// `io.pressure`).
    pub cpu_pressure: Option<Pressure>,
    pub memory_pressure: Option<Pressure>,
    pub io_pressure: Option<Pressure>,
    /// When it was read (Unix nanoseconds); zero when not told.
    pub sampled_at_ns: i64,
}

/// One PSI file: the `some` line, and the `full` line where the kernel writes one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Pressure {
    pub some: PressureLine,
    pub full: Option<PressureLine>,
}

/// `avg10=0.12 avg60=0.05 avg300=0.01 total=12345` (total in microseconds).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PressureLine {
    pub avg10: f64,
    pub avg60: f64,
    pub avg300: f64,
    pub total: u64,
}

impl Pressure {
    /// Parses a PSI file's text; `None` without a valid `some` line.
    pub fn parse(text: &str) -> Option<Self> {
        let mut some = None;
        let mut full = None;
        for line in text.lines() {
            let mut words = line.split_whitespace();
            let slot = match words.next() {
                Some("some") => &mut some,
                Some("full") => &mut full,
                _ => continue,
            };
            let mut parsed = PressureLine::default();
            for word in words {
                match word.split_once('=') {
                    Some(("avg10", v)) => parsed.avg10 = v.parse().ok()?,
                    Some(("avg60", v)) => parsed.avg60 = v.parse().ok()?,
                    Some(("avg300", v)) => parsed.avg300 = v.parse().ok()?,
                    Some(("total", v)) => parsed.total = v.parse().ok()?,
                    _ => {}
                }
            }
            *slot = Some(parsed);
        }
        Some(Self { some: some?, full })
    }

    fn read(path: &Path) -> Option<Self> {
        // A PSI file is a few hundred bytes; read no more than that, whatever is there.
        let mut text = String::new();
        std::io::Read::read_to_string(
            &mut std::io::Read::take(std::fs::File::open(path).ok()?, 4096),
            &mut text,
        )
        .ok()?;
        Self::parse(&text)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryUsage {
    pub usage: u64,
    /// `None` when unlimited.
    pub limit: Option<u64>,
    /// Usage minus inactive file pages, as kubelet evicts by.
    pub working_set: u64,
    pub rss: u64,
    pub page_faults: u64,
    pub major_page_faults: u64,
    pub swap_usage: Option<u64>,
    pub swap_limit: Option<u64>,
}

/// One cgroup file system mount in mountinfo.
pub struct CgroupMount<'a> {
    /// The directory of the hierarchy that is mounted.
    pub root: &'a str,
    pub point: &'a str,
    /// cgroup2 rather than a v1 hierarchy.
    pub v2: bool,
    /// The file system's own options (for v1 its controllers), not the mount's flags.
    pub super_options: &'a str,
}

/// The cgroup mounts (v1 and v2) in a mountinfo text.
pub fn cgroup_mounts(mountinfo: &str) -> impl Iterator<Item = CgroupMount<'_>> {
    mountinfo.lines().filter_map(|line| {
        let (mount, fs) = line.split_once(" - ")?;
        let mut fields = mount.split(' ').skip(3);
        let (root, point) = (fields.next()?, fields.next()?);
        let mut fs = fs.split(' ');
        let v2 = match fs.next()? {
            "cgroup2" => true,
            "cgroup" => false,
            _ => return None,
        };
        let super_options = fs.nth(1)?;
        Some(CgroupMount {
            root,
            point,
            v2,
            super_options,
        })
    })
}

/// Limits at or above this are "unlimited" (v1 reports a page-rounded i64::MAX).
const UNLIMITED: u64 = 1 << 62;

impl CgroupLayout {
    /// The layout of this host, from `/proc/self/mountinfo`.
    pub fn detect() -> Option<Self> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        Self::from_mountinfo(&mountinfo)
    }

    /// Parses mountinfo: v1 controllers win over a unified mount without them (hybrid).
    pub fn from_mountinfo(mountinfo: &str) -> Option<Self> {
        let mut controllers = HashMap::new();
        let mut unified = None;
        for m in cgroup_mounts(mountinfo) {
            let (mount, root) = (PathBuf::from(m.point), PathBuf::from(m.root));
            if m.v2 {
                unified.get_or_insert((mount, root));
                continue;
            }
            for option in m.super_options.split(',') {
                if matches!(option, "cpu" | "cpuacct" | "memory" | "pids") {
                    controllers
                        .entry(option.to_string())
                        .or_insert((mount.clone(), root.clone()));
                }
            }
        }
        if !controllers.is_empty() {
            Some(Self::V1 { controllers })
        } else {
            unified.map(|(mount, root)| Self::V2 { mount, root })
        }
    }

    /// Reads what the cgroup at `cgroup_path` (as in a runtime spec) has used.
    pub fn read(&self, cgroup_path: &str) -> CgroupUsage {
        self.read_path(&resolve_spec_path(cgroup_path))
    }

    /// Only the cumulative CPU time (ns) of the cgroup at `cgroup_path` (as in a runtime
    /// spec): one small file, for sampling every container every second.
    pub fn read_cpu(&self, cgroup_path: &str) -> Option<u64> {
        let relative = resolve_spec_path(cgroup_path);
        match self {
            Self::V2 { mount, root } => {
                let dir = under(mount, root, &relative)?;
                let usec = *read_flat_keyed(&dir.join("cpu.stat")).get("usage_usec")?;
                Some(usec * 1000)
            }
            Self::V1 { controllers } => {
                let (mount, root) = controllers.get("cpuacct")?;
                read_u64(&under(mount, root, &relative)?.join("cpuacct.usage"))
            }
        }
    }

    /// Reads what the cgroup at `relative` (from the hierarchy root) has used.
    pub fn read_path(&self, relative: &Path) -> CgroupUsage {
        let relative = relative.to_path_buf();
        match self {
            Self::V2 { mount, root } => match under(mount, root, &relative) {
                Some(dir) => read_v2(&dir),
                None => CgroupUsage::default(),
            },
            Self::V1 { controllers } => {
                let dir = |controller: &str| {
                    controllers
                        .get(controller)
                        .and_then(|(mount, root)| under(mount, root, &relative))
                };
                // v1 has no pressure files: PSI stays absent, not zero.
                CgroupUsage {
                    cpu_usage_ns: dir("cpuacct").and_then(|d| read_u64(&d.join("cpuacct.usage"))),
                    memory: dir("memory").and_then(|d| read_v1_memory(&d)),
                    pids: dir("pids").and_then(|d| read_u64(&d.join("pids.current"))),
                    ..Default::default()
                }
            }
        }
    }
}

/// CPU and memory limits for a cgroup; `None` leaves a value as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupLimits {
    pub cpu_shares: Option<u64>,
    pub cpu_quota: Option<i64>,
    pub cpu_period: Option<u64>,
    pub memory_limit: Option<i64>,
}

impl CgroupLayout {
    /// Writes `limits` into the existing cgroup at `relative` (v1: `cpu.shares`,
    /// `cpu.cfs_*`, `memory.limit_in_bytes`; v2: `cpu.weight`, `cpu.max`, `memory.max`).
    /// Blocking file I/O: call it off the async threads.
    pub fn apply_limits(&self, relative: &Path, limits: &CgroupLimits) -> std::io::Result<()> {
        let writes = match self {
            Self::V2 { mount, root } => {
                let dir = self.existing_dir(under(mount, root, relative))?;
                v2_limit_writes(&dir, limits)
            }
            Self::V1 { controllers } => {
                let dir = |controller: &str| {
                    self.existing_dir(
                        controllers
                            .get(controller)
                            .and_then(|(mount, root)| under(mount, root, relative)),
                    )
                };
                let mut writes = Vec::new();
                if limits.cpu_shares.is_some() || limits.cpu_quota.is_some() {
                    let cpu = dir("cpu")?;
                    if let Some(shares) = limits.cpu_shares {
                        writes.push((cpu.join("cpu.shares"), shares.to_string()));
                    }
                    if let Some(period) = limits.cpu_period {
                        writes.push((cpu.join("cpu.cfs_period_us"), period.to_string()));
                    }
                    if let Some(quota) = limits.cpu_quota {
                        writes.push((cpu.join("cpu.cfs_quota_us"), quota.to_string()));
                    }
                }
                if let Some(limit) = limits.memory_limit {
                    writes.push((
                        dir("memory")?.join("memory.limit_in_bytes"),
                        limit.to_string(),
                    ));
                }
                writes
            }
        };
        for (path, value) in writes {
            std::fs::write(&path, &value).map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("writing {value} to {}: {e}", path.display()),
                )
            })?;
        }
        Ok(())
    }

    fn existing_dir(&self, dir: Option<PathBuf>) -> std::io::Result<PathBuf> {
        match dir {
            Some(dir) if dir.is_dir() => Ok(dir),
            Some(dir) => Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("cgroup {} does not exist", dir.display()),
            )),
            None => Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "cgroup is outside the mounted hierarchy",
            )),
        }
    }
}

/// v2 files for `limits`: shares map onto weights as runc maps them.
fn v2_limit_writes(dir: &Path, limits: &CgroupLimits) -> Vec<(PathBuf, String)> {
    let mut writes = Vec::new();
    if let Some(shares) = limits.cpu_shares {
        let weight = 1 + ((shares.clamp(2, 262_144) - 2) * 9999) / 262_142;
        writes.push((dir.join("cpu.weight"), weight.to_string()));
    }
    if limits.cpu_quota.is_some() || limits.cpu_period.is_some() {
        let quota = match limits.cpu_quota {
            Some(q) if q > 0 => q.to_string(),
            _ => "max".to_string(),
        };
        let period = limits.cpu_period.unwrap_or(100_000);
        writes.push((dir.join("cpu.max"), format!("{quota} {period}")));
    }
    if let Some(limit) = limits.memory_limit {
        let value = if limit > 0 {
            limit.to_string()
        } else {
            "max".to_string()
        };
        writes.push((dir.join("memory.max"), value));
    }
    writes
}

/// The directory of `relative` (an absolute cgroup path) under a mount whose root is `root`;
/// `None` for a path with `..`, which could leave the mount (limits are written there).
fn under(mount: &Path, root: &Path, relative: &Path) -> Option<PathBuf> {
    if relative
        .components()
        .any(|c| c == std::path::Component::ParentDir)
    {
        return None;
    }
    let inside = relative.strip_prefix(root).ok()?;
    Some(mount.join(inside))
}

/// A runtime spec's cgroupsPath as a path from the hierarchy root: `/a/b` as it is,
/// systemd's `slice:prefix:name` as `/<expanded slice>/<prefix>-<name>.scope`.
pub fn resolve_spec_path(spec_path: &str) -> PathBuf {
    let parts: Vec<&str> = spec_path.split(':').collect();
    if parts.len() == 3 && !spec_path.starts_with('/') {
        let (slice, prefix, name) = (parts[0], parts[1], parts[2]);
        let scope = if prefix.is_empty() {
            format!("{name}.scope")
        } else {
            format!("{prefix}-{name}.scope")
        };
        return expand_slice(slice).join(scope);
    }
    let path = Path::new(spec_path);
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        Path::new("/").join(path)
    }
}

/// The cgroup a spec path's cgroup sits in: the pod's cgroup for a container or sandbox
/// placed under a cgroup parent.
pub fn parent_of(spec_path: &str) -> PathBuf {
    let parts: Vec<&str> = spec_path.split(':').collect();
    if parts.len() == 3 && !spec_path.starts_with('/') {
        return expand_slice(parts[0]);
    }
    resolve_spec_path(spec_path)
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("/"))
}

/// `a-b-c.slice` lives at `/a.slice/a-b.slice/a-b-c.slice`; `-.slice` is the root.
fn expand_slice(slice: &str) -> PathBuf {
    let mut path = PathBuf::from("/");
    let Some(name) = slice.strip_suffix(".slice") else {
        return path.join(slice);
    };
    if name.is_empty() || name == "-" {
        return path;
    }
    let mut prefix = String::new();
    for part in name.split('-') {
        if !prefix.is_empty() {
            prefix.push('-');
        }
        prefix.push_str(part);
        path.push(format!("{prefix}.slice"));
    }
    path
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// A `max`-or-number file (v2).
fn read_limit(path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let text = text.trim();
    if text == "max" {
        return None;
    }
    text.parse().ok().filter(|v| *v < UNLIMITED)
}

/// `key value` lines.
fn read_flat_keyed(path: &Path) -> HashMap<String, u64> {
    std::fs::read_to_string(path)
        .map(|text| {
            text.lines()
                .filter_map(|line| {
                    let (key, value) = line.split_once(' ')?;
                    Some((key.to_string(), value.trim().parse().ok()?))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Whether the kernel accounts swap in cgroup v1 (the `memory.memsw.*` files exist): the
/// same for every cgroup, so looked at once.
static SWAP_ACCOUNTING: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// Whether `dir`'s memsw files are worth reading; `None` when that cannot be told (the
/// cgroup is gone).
fn swap_accounted(dir: &Path) -> Option<bool> {
    if let Some(known) = SWAP_ACCOUNTING.get() {
        return Some(*known);
    }
    if dir.join("memory.memsw.usage_in_bytes").exists() {
        Some(*SWAP_ACCOUNTING.get_or_init(|| true))
    } else if dir.exists() {
        Some(*SWAP_ACCOUNTING.get_or_init(|| false))
    } else {
        None
    }
}

/// The values of `keys` in a flat-keyed file (`key value` lines), without collecting the
/// rest.
fn read_keys<const N: usize>(path: &Path, keys: [&str; N]) -> [u64; N] {
    let mut values = [0; N];
    let Ok(text) = std::fs::read_to_string(path) else {
        return values;
    };
    for line in text.lines() {
        let Some((key, value)) = line.split_once(' ') else {
            continue;
        };
        if let Some(i) = keys.iter().position(|k| *k == key) {
            values[i] = value.trim().parse().unwrap_or(0);
        }
    }
    values
}

fn read_v1_memory(dir: &Path) -> Option<MemoryUsage> {
    let usage = read_u64(&dir.join("memory.usage_in_bytes"))?;
    let [inactive_file, rss, page_faults, major_page_faults] = read_keys(
        &dir.join("memory.stat"),
        [
            "total_inactive_file",
            "total_rss",
            "total_pgfault",
            "total_pgmajfault",
        ],
    );
    let limit = read_u64(&dir.join("memory.limit_in_bytes")).filter(|l| *l < UNLIMITED);
    // memsw counts memory plus swap; the files exist only with swap accounting.
    let (memsw, memsw_limit) = if swap_accounted(dir) == Some(false) {
        (None, None)
    } else {
        (
            read_u64(&dir.join("memory.memsw.usage_in_bytes")),
            read_u64(&dir.join("memory.memsw.limit_in_bytes")).filter(|l| *l < UNLIMITED),
        )
    };
    Some(MemoryUsage {
        usage,
        limit,
        working_set: usage.saturating_sub(inactive_file),
        rss,
        page_faults,
        major_page_faults,
        swap_usage: memsw.map(|m| m.saturating_sub(usage)),
        swap_limit: memsw_limit.map(|m| m.saturating_sub(limit.unwrap_or(0))),
    })
}

fn read_v2(dir: &Path) -> CgroupUsage {
    let cpu = read_flat_keyed(&dir.join("cpu.stat"));
    let memory = read_u64(&dir.join("memory.current")).map(|usage| {
        let stat = read_flat_keyed(&dir.join("memory.stat"));
        let get = |key: &str| stat.get(key).copied().unwrap_or(0);
        MemoryUsage {
            usage,
            limit: read_limit(&dir.join("memory.max")),
            working_set: usage.saturating_sub(get("inactive_file")),
            rss: get("anon"),
            page_faults: get("pgfault"),
            major_page_faults: get("pgmajfault"),
            swap_usage: read_u64(&dir.join("memory.swap.current")),
            swap_limit: read_limit(&dir.join("memory.swap.max")),
        }
    });
    CgroupUsage {
        cpu_usage_ns: cpu.get("usage_usec").map(|usec| usec * 1000),
        memory,
        pids: read_u64(&dir.join("pids.current")),
        cpu_pressure: Pressure::read(&dir.join("cpu.pressure")),
        memory_pressure: Pressure::read(&dir.join("memory.pressure")),
        io_pressure: Pressure::read(&dir.join("io.pressure")),
        sampled_at_ns: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn hybrid_hosts_use_the_v1_controllers() {
        let layout = CgroupLayout::from_mountinfo(HYBRID).unwrap();
        let CgroupLayout::V1 { controllers } = layout else {
            panic!("v1 expected")
        };
        assert_eq!(
            controllers["cpuacct"].0,
            PathBuf::from("/sys/fs/cgroup/cpu,cpuacct")
        );
        assert_eq!(
            controllers["memory"].0,
            PathBuf::from("/sys/fs/cgroup/memory")
        );
    }

    #[test]
    fn a_unified_host_uses_v2() {
        let info = "29 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            CgroupLayout::from_mountinfo(info),
            Some(CgroupLayout::V2 {
                mount: "/sys/fs/cgroup".into(),
                root: "/".into()
            })
        );
    }

    #[test]
    fn systemd_paths_expand_their_slices() {
        assert_eq!(
            resolve_spec_path("kubepods-burstable-pod12.slice:cri-containerd:abc"),
            PathBuf::from(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12.slice/cri-containerd-abc.scope"
            )
        );
        assert_eq!(
            resolve_spec_path("/k8s.io/abc"),
            PathBuf::from("/k8s.io/abc")
        );
        assert_eq!(
            resolve_spec_path("-.slice:p:x"),
            PathBuf::from("/p-x.scope")
        );
        assert_eq!(
            parent_of("kubepods-pod1.slice:cri-containerd:abc"),
            PathBuf::from("/kubepods.slice/kubepods-pod1.slice")
        );
        assert_eq!(
            parent_of("/kubepods/pod1/abc"),
            PathBuf::from("/kubepods/pod1")
        );
    }

    #[test]
    fn pressure_files_parse_with_and_without_full() {
        let cpu = Pressure::parse(
            "some avg10=1.50 avg60=0.25 avg300=0.00 total=12345\n\
             full avg10=0.50 avg60=0.00 avg300=0.00 total=678\n",
        )
        .unwrap();
        assert_eq!(cpu.some.avg10, 1.5);
        assert_eq!(cpu.some.total, 12345);
        assert_eq!(cpu.full.unwrap().total, 678);
        let some_only = Pressure::parse("some avg10=0.00 avg60=0.00 avg300=0.00 total=9").unwrap();
        assert_eq!(some_only.full, None);
        assert_eq!(Pressure::parse(""), None);
        assert_eq!(Pressure::parse("some avg10=x total=1"), None);
    }

    #[test]
    fn v2_reads_pressure_and_v1_leaves_it_absent() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("pod");
        std::fs::create_dir_all(&dir).unwrap();
        for file in ["cpu.pressure", "memory.pressure", "io.pressure"] {
            std::fs::write(
                dir.join(file),
                "some avg10=0.10 avg60=0.20 avg300=0.30 total=40\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=5\n",
            )
            .unwrap();
        }
        let v2 = CgroupLayout::V2 {
            mount: tmp.path().to_path_buf(),
            root: "/".into(),
        };
        let usage = v2.read_path(Path::new("/pod"));
        assert_eq!(usage.io_pressure.unwrap().some.total, 40);
        assert_eq!(usage.memory_pressure.unwrap().full.unwrap().total, 5);
        assert!(usage.cpu_pressure.is_some());
        let v1 = CgroupLayout::V1 {
            controllers: [(
                "memory".to_string(),
                (tmp.path().to_path_buf(), PathBuf::from("/")),
            )]
            .into_iter()
            .collect(),
        };
        let usage = v1.read_path(Path::new("/pod"));
        assert!(usage.cpu_pressure.is_none() && usage.io_pressure.is_none());
    }

    #[test]
    fn limits_are_written_to_v1_and_v2_files() {
        let tmp = tempfile::tempdir().unwrap();
        let limits = CgroupLimits {
            cpu_shares: Some(1024),
            cpu_quota: Some(50_000),
            cpu_period: Some(100_000),
            memory_limit: Some(64 << 20),
        };
        let v2 = CgroupLayout::V2 {
            mount: tmp.path().join("v2"),
            root: "/".into(),
        };
        std::fs::create_dir_all(tmp.path().join("v2/pod")).unwrap();
        v2.apply_limits(Path::new("/pod"), &limits).unwrap();
        let read = |p: &str| std::fs::read_to_string(tmp.path().join(p)).unwrap();
        assert_eq!(read("v2/pod/cpu.max"), "50000 100000");
        assert_eq!(read("v2/pod/cpu.weight"), "39");
        assert_eq!(read("v2/pod/memory.max"), (64u64 << 20).to_string());

        let controllers = ["cpu", "memory"]
            .into_iter()
            .map(|c| (c.to_string(), (tmp.path().join(c), PathBuf::from("/"))))
            .collect();
        let v1 = CgroupLayout::V1 { controllers };
        std::fs::create_dir_all(tmp.path().join("cpu/pod")).unwrap();
        std::fs::create_dir_all(tmp.path().join("memory/pod")).unwrap();
        v1.apply_limits(Path::new("/pod"), &limits).unwrap();
        assert_eq!(read("cpu/pod/cpu.shares"), "1024");
        assert_eq!(read("cpu/pod/cpu.cfs_quota_us"), "50000");
        assert_eq!(
            read("memory/pod/memory.limit_in_bytes"),
            (64u64 << 20).to_string()
        );

        let missing = v1.apply_limits(Path::new("/gone"), &limits).unwrap_err();
        assert_eq!(missing.kind(), std::io::ErrorKind::NotFound);
    }

    #[test]
    fn limits_are_never_written_outside_the_hierarchy() {
        let tmp = tempfile::tempdir().unwrap();
        let controllers = ["cpu", "memory"]
            .into_iter()
            .map(|c| {
                (
                    c.to_string(),
                    (tmp.path().join("fs").join(c), PathBuf::from("/")),
                )
            })
            .collect();
        let v1 = CgroupLayout::V1 { controllers };
        std::fs::create_dir_all(tmp.path().join("fs/memory")).unwrap();
        let limits = CgroupLimits {
            memory_limit: Some(1 << 20),
            ..Default::default()
        };
        // fs/memory/../.. is the temp dir itself, which exists.
        let escape = v1.apply_limits(Path::new("/../.."), &limits).unwrap_err();
        assert_eq!(escape.kind(), std::io::ErrorKind::NotFound);
        assert!(!tmp.path().join("memory.limit_in_bytes").exists());
    }

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap();
    }

    #[test]
    fn reads_v1_files() {
        let tmp = tempfile::tempdir().unwrap();
        let mut controllers = HashMap::new();
        for c in ["cpuacct", "memory", "pids"] {
            let dir = tmp.path().join(c).join("k8s.io/abc");
            std::fs::create_dir_all(&dir).unwrap();
            controllers.insert(c.to_string(), (tmp.path().join(c), PathBuf::from("/")));
        }
        let cg = |c: &str| tmp.path().join(c).join("k8s.io/abc");
        write(&cg("cpuacct"), "cpuacct.usage", "123456789\n");
        write(&cg("memory"), "memory.usage_in_bytes", "10000\n");
        write(
            &cg("memory"),
            "memory.limit_in_bytes",
            "9223372036854771712\n",
        );
        write(
            &cg("memory"),
            "memory.stat",
            "cache 5\ntotal_inactive_file 3000\ntotal_rss 6000\ntotal_pgfault 7\ntotal_pgmajfault 1\n",
        );
        write(&cg("pids"), "pids.current", "4\n");
        let layout = CgroupLayout::V1 { controllers };
        assert_eq!(layout.read_cpu("/k8s.io/abc"), Some(123_456_789));
        let usage = layout.read("/k8s.io/abc");
        assert_eq!(usage.cpu_usage_ns, Some(123_456_789));
        assert_eq!(usage.pids, Some(4));
        let memory = usage.memory.unwrap();
        assert_eq!(memory.working_set, 7000);
        assert_eq!(memory.rss, 6000);
        assert_eq!(memory.limit, None, "v1's unlimited is no limit");
        assert_eq!((memory.page_faults, memory.major_page_faults), (7, 1));
        assert_eq!(memory.swap_usage, None);
    }

    #[test]
    fn reads_v2_files_below_a_mount_root() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("pod/c1");
        std::fs::create_dir_all(&dir).unwrap();
        write(&dir, "cpu.stat", "usage_usec 2500\nuser_usec 2000\n");
        write(&dir, "memory.current", "8192\n");
        write(&dir, "memory.max", "max\n");
        write(
            &dir,
            "memory.stat",
            "anon 4096\ninactive_file 1024\npgfault 3\npgmajfault 0\n",
        );
        write(&dir, "memory.swap.current", "0\n");
        write(&dir, "pids.current", "2\n");
        // The mount shows the hierarchy from /kubepods down, as inside a cgroup namespace.
        let layout = CgroupLayout::V2 {
            mount: tmp.path().to_path_buf(),
            root: "/kubepods".into(),
        };
        assert_eq!(layout.read_cpu("/kubepods/pod/c1"), Some(2_500_000));
        assert_eq!(layout.read_cpu("/elsewhere/x"), None);
        let usage = layout.read("/kubepods/pod/c1");
        assert_eq!(usage.cpu_usage_ns, Some(2_500_000));
        let memory = usage.memory.unwrap();
        assert_eq!(
            (memory.usage, memory.working_set, memory.rss),
            (8192, 7168, 4096)
        );
        assert_eq!(memory.limit, None);
        assert_eq!(memory.swap_usage, Some(0));
        assert_eq!(usage.pids, Some(2));
        assert_eq!(layout.read("/elsewhere/x"), CgroupUsage::default());
    }
}
