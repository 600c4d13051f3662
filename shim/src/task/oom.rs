//! OOM kills in a container's memory cgroup, reported as `/tasks/oom` events: cgroup v2 by
//! watching `memory.events` for a higher `oom_kill` count, cgroup v1 by an eventfd on
//! `memory.oom_control`. A watcher ends when its cgroup is removed.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::task::JoinHandle;

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The memory cgroup directory of a process, in whichever layout the host has.
pub fn memory_cgroup(pid: i32) -> io::Result<(PathBuf, bool)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
    let unified = Path::new(CGROUP_ROOT).join("cgroup.controllers").exists();
    let dir = memory_cgroup_in(&text, unified)
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "process has no memory cgroup"))?;
    Ok((dir, unified))
}

fn memory_cgroup_in(proc_cgroup: &str, unified: bool) -> Option<PathBuf> {
    proc_cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let relative = path.trim_start_matches('/');
        if relative.split('/').any(|c| c == "..") {
            return None;
        }
        if unified {
            (controllers.is_empty()).then(|| Path::new(CGROUP_ROOT).join(relative))
        } else {
            controllers
                .split(',')
                .any(|c| c == "memory")
                .then(|| Path::new(CGROUP_ROOT).join("memory").join(relative))
        }
    })
}

/// The least time between two OOM events of one container: each says the same (the
/// container hit its limit), and a process that forks into its limit gets killed hundreds
/// of times a second, events that would crowd out the pod's exits on the way to containerd.
const OOM_EVENT_GAP: std::time::Duration = std::time::Duration::from_secs(1);

/// Watches the memory cgroup of `pid`; `on_oom` runs for an OOM kill, at most once per
/// [`OOM_EVENT_GAP`].
pub fn watch(pid: i32, on_oom: impl Fn() + Send + 'static) -> io::Result<JoinHandle<()>> {
    let on_oom = at_most_every(OOM_EVENT_GAP, on_oom);
    let (dir, unified) = memory_cgroup(pid)?;
    if unified {
        watch_v2(dir, on_oom)
    } else {
        watch_v1(dir, on_oom)
    }
}

fn watch_v2(dir: PathBuf, on_oom: impl Fn() + Send + 'static) -> io::Result<JoinHandle<()>> {
    let events = dir.join("memory.events");
    let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
    inotify.add_watch(&events, AddWatchFlags::IN_MODIFY)?;
    let mut kills = oom_kills(&events).unwrap_or(0);
    let fd = crate::task::stdio::async_fd(OwnedFd::from(inotify))?;
    Ok(tokio::spawn(async move {
        let mut buf = [0u8; 4096];
        loop {
            let Ok(mut ready) = fd.readable().await else {
                return;
            };
            match nix::unistd::read(fd.get_ref(), &mut buf) {
                Err(nix::errno::Errno::EAGAIN) => {
                    ready.clear_ready();
                    continue;
                }
                Err(_) | Ok(0) => return,
                Ok(_) => {}
            }
            let Some(now) = oom_kills(&events) else {
                return;
            };
            if now > kills {
                on_oom();
            }
            kills = now;
        }
    }))
}

/// `f`, skipping calls that come within `gap` of the last one it ran.
fn at_most_every(gap: std::time::Duration, f: impl Fn() + Send + 'static) -> impl Fn() + Send {
    let last = std::sync::Mutex::new(None::<std::time::Instant>);
    move || {
        let mut last = last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if last.is_some_and(|at| at.elapsed() < gap) {
            return;
        }
        *last = Some(std::time::Instant::now());
        f();
    }
}

fn oom_kills(events: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(events).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
}

fn watch_v1(dir: PathBuf, on_oom: impl Fn() + Send + 'static) -> io::Result<JoinHandle<()>> {
    let eventfd = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?;
    let control = std::fs::File::open(dir.join("memory.oom_control"))?;
    std::fs::write(
        dir.join("cgroup.event_control"),
        format!(
            "{} {}",
            eventfd.as_fd().as_raw_fd(),
            control.as_fd().as_raw_fd()
        ),
    )?;
    let fd = crate::task::stdio::async_fd(OwnedFd::from(eventfd))?;
    Ok(tokio::spawn(async move {
        // The control file stays open as long as the registration should.
        let _control = control;
        loop {
            let Ok(mut ready) = fd.readable().await else {
                return;
            };
            match read_counter(fd.get_ref()) {
                Err(nix::errno::Errno::EAGAIN) => {
                    ready.clear_ready();
                    continue;
                }
                Err(_) => return,
                Ok(_) => {}
            }
            // The event also fires when the cgroup goes away.
            if !dir.join("memory.oom_control").exists() {
                return;
            }
            on_oom();
        }
    }))
}

fn read_counter(fd: &OwnedFd) -> nix::Result<u64> {
    let mut buf = [0u8; 8];
    nix::unistd::read(fd, &mut buf).map(|_| u64::from_ne_bytes(buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_cgroup_is_found_in_either_layout() {
        let v1 = "12:pids:/a\n5:cpuacct,cpu:/a\n4:memory:/kubepods/pod1/c1\n0::/\n";
        assert_eq!(
            memory_cgroup_in(v1, false),
            Some(PathBuf::from("/sys/fs/cgroup/memory/kubepods/pod1/c1"))
        );
        let v2 = "0::/kubepods/pod1/c1\n";
        assert_eq!(
            memory_cgroup_in(v2, true),
            Some(PathBuf::from("/sys/fs/cgroup/kubepods/pod1/c1"))
        );
        assert_eq!(memory_cgroup_in("4:memory:/../../etc\n", false), None);
        assert_eq!(memory_cgroup_in("4:cpu:/a\n", false), None);
    }

    #[test]
    fn a_storm_of_oom_kills_is_one_event_a_gap() {
        let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = calls.clone();
        let on_oom = at_most_every(std::time::Duration::from_millis(200), move || {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        for _ in 0..1000 {
            on_oom();
        }
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
        std::thread::sleep(std::time::Duration::from_millis(250));
        on_oom();
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[test]
    fn oom_kill_count_is_read_from_memory_events() {
        let dir = tempfile::tempdir().expect("tempdir");
        let events = dir.path().join("memory.events");
        std::fs::write(&events, "low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\n").expect("write");
        assert_eq!(oom_kills(&events), Some(2));
    }
}
