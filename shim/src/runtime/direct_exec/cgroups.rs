//! The cgroups an exec joins: those of the container's init, in every hierarchy, found
//! from its `/proc/<pid>/cgroup` and this mount namespace's cgroup mounts.

use std::path::PathBuf;

/// The init's cgroup directories.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct InitCgroups {
    /// One directory per hierarchy.
    pub dirs: Vec<PathBuf>,
    /// The v1 freezer's directory, if there is that hierarchy.
    pub freezer: Option<PathBuf>,
    /// The unified (v2) hierarchy's directory, if the init is in one.
    pub unified: Option<PathBuf>,
}

struct CgroupMount<'a> {
    root: &'a str,
    point: &'a str,
    /// None: cgroup v2; else the v1 hierarchy's super options (its controllers).
    options: Option<Vec<&'a str>>,
}

fn cgroup_mounts(mountinfo: &str) -> Vec<CgroupMount<'_>> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (mount, fs) = line.split_once(" - ")?;
            let mount: Vec<&str> = mount.split(' ').collect();
            let fs: Vec<&str> = fs.split(' ').collect();
            let (root, point) = (*mount.get(3)?, *mount.get(4)?);
            // An escaped name (a space in it) is no cgroup mount crius made.
            if point.contains('\\') || root.contains('\\') {
                return None;
            }
            match *fs.first()? {
                "cgroup2" => Some(CgroupMount {
                    root,
                    point,
                    options: None,
                }),
                "cgroup" => Some(CgroupMount {
                    root,
                    point,
                    options: Some(fs.get(2)?.split(',').collect()),
                }),
                _ => None,
            }
        })
        .collect()
}

/// Where each line of a `/proc/<pid>/cgroup` is mounted here.
pub fn init_cgroups(proc_cgroup: &str, mountinfo: &str) -> Result<InitCgroups, String> {
    let mounts = cgroup_mounts(mountinfo);
    let mut found = InitCgroups::default();
    for line in proc_cgroup.lines().filter(|l| !l.is_empty()) {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            return Err(format!("unreadable cgroup line {line:?}"));
        };
        if !path.starts_with('/') || path.split('/').any(|part| part == "..") {
            return Err(format!("unusable cgroup path {path:?}"));
        }
        let wanted: Vec<&str> = controllers.split(',').filter(|c| !c.is_empty()).collect();
        let shown = mounts.iter().find_map(|m| {
            let serves = match &m.options {
                None => wanted.is_empty(),
                Some(options) => !wanted.is_empty() && wanted.iter().all(|c| options.contains(c)),
            };
            serves
                .then(|| below_root(path, m.root))
                .flatten()
                .map(|below| (m, below))
        });
        let Some((mount, below)) = shown else {
            // A named hierarchy of another manager is not runc's to join, nor the unified
            // one of a host that mounts no cgroup2 (its `0::/` line is always there); a
            // controller's left out would let the exec escape its limits.
            let named = !wanted.is_empty() && wanted.iter().all(|c| c.starts_with("name="));
            let unmounted_unified =
                wanted.is_empty() && !mounts.iter().any(|m| m.options.is_none());
            if named || unmounted_unified {
                continue;
            }
            return Err(format!("the init's cgroup {line:?} is not mounted here"));
        };
        let dir = PathBuf::from(mount.point).join(below);
        if wanted.contains(&"freezer") {
            found.freezer = Some(dir.clone());
        }
        if mount.options.is_none() {
            found.unified = Some(dir.clone());
        }
        found.dirs.push(dir);
    }
    Ok(found)
}

/// `path` relative to a mount's root (None: the mount does not show it).
fn below_root<'a>(path: &'a str, root: &str) -> Option<&'a str> {
    if root == "/" {
        return Some(path.trim_start_matches('/'));
    }
    let rest = path.strip_prefix(root)?;
    (rest.is_empty() || rest.starts_with('/')).then(|| rest.trim_start_matches('/'))
}

impl InitCgroups {
    /// Whether the container is frozen (paused, or being frozen by a `kill --all`): runc
    /// refuses an exec then, and a process joining the cgroup would freeze with it.
    pub fn frozen(&self) -> bool {
        if let Some(freezer) = &self.freezer {
            return std::fs::read_to_string(freezer.join("freezer.state"))
                .is_ok_and(|state| state.trim() != "THAWED");
        }
        self.unified.as_ref().is_some_and(|unified| {
            std::fs::read_to_string(unified.join("cgroup.freeze"))
                .is_ok_and(|freeze| freeze.trim() == "1")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
25 1 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
27 25 0:24 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd
30 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
31 25 0:28 / /sys/fs/cgroup/freezer rw - cgroup cgroup rw,freezer
40 1 8:1 / /data\\040dir rw - ext4 /dev/vda rw
";

    #[test]
    fn each_hierarchy_of_the_init_is_found_where_it_is_mounted() {
        let proc_cgroup = "\
9:name=systemd:/k8s/c1
6:freezer:/k8s/c1
2:cpu,cpuacct:/k8s/c1
9:name=other:/k8s/c1
0::/k8s/c1
";
        let found = init_cgroups(proc_cgroup, HYBRID).expect("cgroups");
        assert_eq!(
            found.dirs,
            [
                "/sys/fs/cgroup/systemd/k8s/c1",
                "/sys/fs/cgroup/freezer/k8s/c1",
                "/sys/fs/cgroup/cpu,cpuacct/k8s/c1",
                "/sys/fs/cgroup/unified/k8s/c1",
            ]
            .map(PathBuf::from)
        );
        assert_eq!(found.freezer, Some("/sys/fs/cgroup/freezer/k8s/c1".into()));
        assert_eq!(found.unified, Some("/sys/fs/cgroup/unified/k8s/c1".into()));
    }

    #[test]
    fn a_unified_host_has_one_directory() {
        let mountinfo = "30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let found = init_cgroups("0::/pods/c2\n", mountinfo).expect("cgroups");
        assert_eq!(found.dirs, [PathBuf::from("/sys/fs/cgroup/pods/c2")]);
        assert_eq!(found.freezer, None);
    }

    #[test]
    fn a_v1_host_without_cgroup2_joins_no_unified_hierarchy() {
        let v1 = "30 25 0:27 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n";
        let found = init_cgroups("1:cpu:/k8s/c1\n0::/\n", v1).expect("cgroups");
        assert_eq!(found.dirs, [PathBuf::from("/sys/fs/cgroup/cpu/k8s/c1")]);
        assert_eq!(found.unified, None);
    }

    #[test]
    fn a_controller_that_is_not_mounted_here_is_refused() {
        let err = init_cgroups("3:rdma:/k8s/c1\n", HYBRID).expect_err("no rdma mount");
        assert!(err.contains("rdma"), "{err}");
        // A bind-mounted subtree that does not show the path is no mount of it either.
        let sub = "30 1 0:26 /other /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert!(init_cgroups("0::/k8s/c1\n", sub).is_err());
    }

    #[test]
    fn paths_that_climb_or_lines_that_do_not_parse_are_refused() {
        assert!(init_cgroups("0::/a/../b\n", HYBRID).is_err());
        assert!(init_cgroups("0::relative\n", HYBRID).is_err());
        assert!(init_cgroups("garbage\n", HYBRID).is_err());
    }

    #[test]
    fn a_bind_mounted_subtree_maps_below_its_root() {
        assert_eq!(below_root("/a/b/c", "/a/b"), Some("c"));
        assert_eq!(below_root("/a/b", "/a/b"), Some(""));
        assert_eq!(below_root("/a/bc", "/a/b"), None);
        assert_eq!(below_root("/x", "/"), Some("x"));
    }

    #[test]
    fn a_frozen_freezer_is_seen() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("freezer.state"), "FROZEN\n").expect("state");
        let cgroups = InitCgroups {
            dirs: vec![dir.path().to_path_buf()],
            freezer: Some(dir.path().to_path_buf()),
            unified: None,
        };
        assert!(cgroups.frozen());
        std::fs::write(dir.path().join("freezer.state"), "THAWED\n").expect("state");
        assert!(!cgroups.frozen());
        std::fs::write(dir.path().join("cgroup.freeze"), "1\n").expect("freeze");
        let unified = InitCgroups {
            dirs: vec![dir.path().to_path_buf()],
            freezer: None,
            unified: Some(dir.path().to_path_buf()),
        };
        assert!(unified.frozen());
    }
}
