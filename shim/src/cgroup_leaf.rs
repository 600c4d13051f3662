//! The cgroup directories of a container whose `runc create` did not finish. A runc killed
//! in the middle has made them but not yet written its state, so `runc delete` cannot find
//! them and nothing else ever removes them.

use std::path::Path;

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Removes the container's cgroup at the spec's `cgroupsPath` (a cgroupfs path) from every
/// hierarchy where it is empty: the unified one and each v1 controller's. A cgroup with a
/// process or a child stays (the kernel refuses), as does runc's systemd form
/// (`slice:prefix:name`), which is systemd's to remove.
pub fn remove_empty(cgroups_path: &str) {
    remove_empty_below(Path::new(CGROUP_ROOT), cgroups_path);
}

fn remove_empty_below(root: &Path, cgroups_path: &str) {
    let relative = cgroups_path.trim_matches('/');
    if relative.is_empty() || !crate::pod::is_cgroup_path(relative, 4096, false) {
        return;
    }
    let _ = std::fs::remove_dir(root.join(relative));
    let Ok(hierarchies) = std::fs::read_dir(root) else {
        return;
    };
    for hierarchy in hierarchies.filter_map(Result::ok) {
        let dir = hierarchy.path().join(relative);
        if dir.is_dir() {
            match std::fs::remove_dir(&dir) {
                Ok(()) => log::info!(
                    "removed the cgroup {} of an unfinished create",
                    dir.display()
                ),
                Err(e) => log::debug!("cgroup {} stays: {e}", dir.display()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_leaves_go_from_every_hierarchy_and_nothing_else_does() {
        let root = tempfile::tempdir().unwrap();
        for hierarchy in ["memory", "pids", "unified"] {
            std::fs::create_dir_all(root.path().join(hierarchy).join("kubepods/pod1/c1")).unwrap();
        }
        // A leaf with something in it stays (as the kernel keeps a cgroup with a process).
        std::fs::write(root.path().join("pids/kubepods/pod1/c1/x"), "").unwrap();
        remove_empty_below(root.path(), "/kubepods/pod1/c1");
        assert!(!root.path().join("memory/kubepods/pod1/c1").exists());
        assert!(!root.path().join("unified/kubepods/pod1/c1").exists());
        assert!(root.path().join("pids/kubepods/pod1/c1").exists());
        assert!(
            root.path().join("memory/kubepods/pod1").exists(),
            "the pod's stays"
        );

        for refused in ["system.slice:crius:c1", "/kubepods/../pod1", ""] {
            std::fs::create_dir_all(root.path().join("memory/kubepods/pod1/c2")).unwrap();
            remove_empty_below(root.path(), refused);
            assert!(
                root.path().join("memory/kubepods/pod1").exists(),
                "{refused:?}"
            );
        }
    }
}
