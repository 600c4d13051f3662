//! The cgroup directories of a container whose `runc create` did not finish. A runc killed
//! in the middle has made them but not yet written its state, so `runc delete` cannot find
//! them and nothing else ever removes them.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// How long a cgroup that still has a process is tried again: the runc init of a killed
/// runc dies by its parent-death signal a moment after runc, and its cgroup empties then.
const EMPTYING: Duration = Duration::from_secs(5);
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// The background removals still going: the shim waits for them before it exits.
static PENDING: Mutex<Vec<JoinHandle<()>>> = Mutex::new(Vec::new());

/// Removes the container's cgroup at the spec's `cgroupsPath` (a cgroupfs path) from every
/// hierarchy where it is empty: the unified one and each v1 controller's. One that still
/// has a process (or a child) is tried again in the background for a few seconds; runc's
/// systemd form (`slice:prefix:name`) is left to systemd.
pub fn remove_empty(cgroups_path: &str) {
    let busy = remove_empty_below(Path::new(CGROUP_ROOT), cgroups_path);
    if !busy.is_empty() {
        let removal = std::thread::spawn(move || remove_when_empty(busy, EMPTYING));
        if let Ok(mut pending) = PENDING.lock() {
            pending.retain(|r| !r.is_finished());
            pending.push(removal);
        }
    }
}

/// Waits for the background removals (each ends within `EMPTYING`): a shim exiting right
/// after a failed create would otherwise take an unfinished one with it.
pub fn finish_pending() {
    let removals = match PENDING.lock() {
        Ok(mut pending) => std::mem::take(&mut *pending),
        Err(_) => return,
    };
    for removal in removals {
        let _ = removal.join();
    }
}

/// Tries each of `dirs` again until it is gone or `within` has passed.
fn remove_when_empty(mut dirs: Vec<PathBuf>, within: Duration) {
    let until = Instant::now() + within;
    while !dirs.is_empty() && Instant::now() < until {
        std::thread::sleep(RETRY_PAUSE);
        dirs.retain(|dir| remove_dir(dir).is_err());
    }
    for dir in dirs {
        log::warn!(
            "the cgroup {} of an unfinished create still has a process",
            dir.display()
        );
    }
}

/// Removes the leaf below each hierarchy of `root`; returns the ones that stay for now.
fn remove_empty_below(root: &Path, cgroups_path: &str) -> Vec<PathBuf> {
    let relative = cgroups_path.trim_matches('/');
    if relative.is_empty() || !crate::pod::is_cgroup_path(relative, 4096, false) {
        return Vec::new();
    }
    let mut dirs = vec![root.join(relative)];
    if let Ok(hierarchies) = std::fs::read_dir(root) {
        dirs.extend(
            hierarchies
                .filter_map(Result::ok)
                .map(|h| h.path().join(relative)),
        );
    }
    dirs.into_iter()
        .filter(|dir| dir.is_dir())
        .filter(|dir| remove_dir(dir).is_err())
        .collect()
}

fn remove_dir(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir(dir) {
        Ok(()) => {
            log::info!(
                "removed the cgroup {} of an unfinished create",
                dir.display()
            );
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
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
        let busy = remove_empty_below(root.path(), "/kubepods/pod1/c1");
        assert_eq!(busy, vec![root.path().join("pids/kubepods/pod1/c1")]);
        assert!(!root.path().join("memory/kubepods/pod1/c1").exists());
        assert!(!root.path().join("unified/kubepods/pod1/c1").exists());
        assert!(root.path().join("pids/kubepods/pod1/c1").exists());
        assert!(
            root.path().join("memory/kubepods/pod1").exists(),
            "the pod's stays"
        );

        for refused in ["system.slice:crius:c1", "/kubepods/../pod1", ""] {
            std::fs::create_dir_all(root.path().join("memory/kubepods/pod1/c2")).unwrap();
            assert!(remove_empty_below(root.path(), refused).is_empty());
            assert!(
                root.path().join("memory/kubepods/pod1").exists(),
                "{refused:?}"
            );
        }
    }

    #[test]
    fn a_leaf_whose_process_goes_a_moment_later_is_removed_then() {
        let root = tempfile::tempdir().unwrap();
        let leaf = root.path().join("memory/kubepods/pod1/c1");
        std::fs::create_dir_all(&leaf).unwrap();
        // Stands for the init still in the cgroup: it goes 300 ms later.
        std::fs::write(leaf.join("init"), "").unwrap();
        let busy = remove_empty_below(root.path(), "/kubepods/pod1/c1");
        assert_eq!(busy, vec![leaf.clone()]);
        let init = leaf.join("init");
        let exits = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            std::fs::remove_file(init).unwrap();
        });
        remove_when_empty(busy, Duration::from_secs(3));
        exits.join().unwrap();
        assert!(!leaf.exists());
    }
}
