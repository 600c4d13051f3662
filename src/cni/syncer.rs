//! The CNI conf syncer: watches the conf dir and reloads the networks on any change.
//!
//! It watches the conf dir and its parent, so a file that arrives by rename and a conf dir
//! that is deleted and recreated are both seen (containerd's syncer misses both). notify's
//! callback runs on its own thread: it drops access events (reading the dir on reload opens
//! it, which would otherwise loop) and forwards the rest to tokio over a channel, where they
//! are debounced until 100 ms pass quietly. The watcher failing is fatal to the syncer: the
//! service treats that as a critical failure.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{Event, EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::NetworkConfigs;

/// Changes are applied once the conf dir has been quiet this long...
const DEBOUNCE: Duration = Duration::from_millis(100);
/// ...or this long after the first change, whichever comes first.
const MAX_DELAY: Duration = Duration::from_secs(1);

/// Why the syncer stopped.
#[derive(Debug, thiserror::Error)]
pub enum SyncerError {
    #[error("failed to create CNI conf dir {dir}: {source}")]
    CreateDir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("failed to watch {path}: {source}")]
    Watch {
        path: PathBuf,
        source: notify::Error,
    },
    #[error("CNI conf dir watcher failed: {0}")]
    Watcher(notify::Error),
    #[error("CNI conf dir watcher stopped unexpectedly")]
    WatcherGone,
    #[error(transparent)]
    Failpoint(#[from] crate::failpoint::Triggered),
}

/// Keeps `NetworkConfigs` in step with the conf dir.
pub struct CniConfSyncer {
    configs: Arc<NetworkConfigs>,
}

impl CniConfSyncer {
    pub fn new(configs: Arc<NetworkConfigs>) -> Self {
        Self { configs }
    }

    /// Watches until `cancel` fires (`Ok`) or the watcher fails (`Err`).
    /// Reloads the networks on a blocking thread: it reads every file of the conf dir.
    async fn reload_off_the_workers(&self) {
        let configs = self.configs.clone();
        if let Err(e) = tokio::task::spawn_blocking(move || configs.reload()).await {
            tracing::warn!(error = %e, "reloading the CNI config failed");
        }
    }

    pub async fn run(self, cancel: CancellationToken) -> Result<(), SyncerError> {
        let conf_dir = self.configs.conf_dir().to_path_buf();
        std::fs::create_dir_all(&conf_dir).map_err(|source| SyncerError::CreateDir {
            dir: conf_dir.clone(),
            source,
        })?;
        let parent = conf_dir
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("/"));

        let (tx, mut rx) = mpsc::unbounded_channel::<notify::Result<Event>>();
        let watched_dir = conf_dir.clone();
        let mut watcher = notify::recommended_watcher(move |res: notify::Result<Event>| {
            if let Ok(event) = &res
                && !concerns(&watched_dir, event)
            {
                return;
            }
            // The receiver is gone only when the syncer has stopped.
            let _ = tx.send(res);
        })
        .map_err(SyncerError::Watcher)?;
        watcher
            .watch(&parent, RecursiveMode::NonRecursive)
            .map_err(|source| SyncerError::Watch {
                path: parent.clone(),
                source,
            })?;
        let mut watched = None;
        ensure_dir_watch(&mut watcher, &conf_dir, &mut watched);
        // Anything that changed between the first load and the watch being in place.
        self.reload_off_the_workers().await;
        crate::failpoint::hit("cni_conf_syncer").await?;
        tracing::info!(conf_dir = %conf_dir.display(), "CNI conf syncer started");

        loop {
            let first = tokio::select! {
                _ = cancel.cancelled() => return Ok(()),
                event = rx.recv() => event,
            };
            check(first)?;
            // Debounce: gather events until none arrives for DEBOUNCE, at most MAX_DELAY.
            let give_up = tokio::time::Instant::now() + MAX_DELAY;
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(DEBOUNCE) => break,
                    _ = tokio::time::sleep_until(give_up) => break,
                    event = rx.recv() => check(event)?,
                }
            }
            ensure_dir_watch(&mut watcher, &conf_dir, &mut watched);
            tracing::debug!("CNI conf dir changed");
            self.reload_off_the_workers().await;
        }
    }
}

/// Whether a watcher event is about the conf dir or its contents. Access events are not:
/// reading the dir on reload opens it, which would otherwise trigger the next reload.
fn concerns(conf_dir: &Path, event: &Event) -> bool {
    !matches!(event.kind, EventKind::Access(_))
        && event.paths.iter().any(|p| p.starts_with(conf_dir))
}

/// A closed channel or a watcher error ends the syncer.
fn check(event: Option<notify::Result<Event>>) -> Result<(), SyncerError> {
    match event {
        None => Err(SyncerError::WatcherGone),
        Some(Err(e)) => Err(SyncerError::Watcher(e)),
        Some(Ok(_)) => Ok(()),
    }
}

/// Which directory a watch is on: the inode and its birth time, so a conf dir that was
/// deleted and recreated (a new directory, perhaps with a reused inode number) is told apart.
type DirIdentity = (u64, Option<std::time::SystemTime>);

fn dir_identity(dir: &Path) -> Option<DirIdentity> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(dir).ok().filter(|m| m.is_dir())?;
    Some((meta.ino(), meta.created().ok()))
}

/// Keeps a watch on the conf dir itself: (re-)established when the directory is new.
fn ensure_dir_watch(watcher: &mut dyn Watcher, dir: &Path, watched: &mut Option<DirIdentity>) {
    let current = dir_identity(dir);
    if current.is_none() || current == *watched {
        *watched = current.filter(|_| watched.is_some());
        return;
    }
    // Drop the stale watch of a deleted directory before watching the new one.
    let _ = watcher.unwatch(dir);
    *watched = match watcher.watch(dir, RecursiveMode::NonRecursive) {
        Ok(()) => current,
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot watch CNI conf dir yet");
            None
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONF: &str = r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"}]}"#;

    async fn wait_ready(configs: &NetworkConfigs, want: bool) -> bool {
        for _ in 0..40 {
            if configs.ready().is_ok() == want {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    #[tokio::test]
    async fn follows_add_remove_rename_and_dir_recreate() {
        let root = tempfile::tempdir().unwrap();
        let conf_dir = root.path().join("net.d");
        let configs = Arc::new(NetworkConfigs::load(
            conf_dir.clone(),
            vec![PathBuf::from("/usr/lib/cni")],
            1,
        ));
        assert!(configs.ready().is_err());
        let cancel = CancellationToken::new();
        let task = tokio::spawn(CniConfSyncer::new(configs.clone()).run(cancel.clone()));
        // Let the watches be established.
        tokio::time::sleep(Duration::from_millis(200)).await;
        // A busy sibling of the conf dir (a log file, say) must not delay reloads.
        let noise = root.path().join("noise.log");
        let noisy = tokio::spawn(async move {
            loop {
                let _ = std::fs::write(&noise, b"x");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });

        std::fs::write(conf_dir.join("10-n.conflist"), CONF).unwrap();
        assert!(wait_ready(&configs, true).await, "file added");
        std::fs::remove_file(conf_dir.join("10-n.conflist")).unwrap();
        assert!(wait_ready(&configs, false).await, "file removed");

        let staged = root.path().join("staged.conflist");
        std::fs::write(&staged, CONF).unwrap();
        std::fs::rename(&staged, conf_dir.join("10-n.conflist")).unwrap();
        assert!(wait_ready(&configs, true).await, "file renamed in");

        std::fs::remove_dir_all(&conf_dir).unwrap();
        assert!(wait_ready(&configs, false).await, "dir removed");
        std::fs::create_dir(&conf_dir).unwrap();
        std::fs::write(conf_dir.join("10-n.conflist"), CONF).unwrap();
        assert!(wait_ready(&configs, true).await, "file in recreated dir");

        noisy.abort();
        // Quiet conf dir: no further reloads (reading the dir must not trigger itself).
        tokio::time::sleep(Duration::from_millis(300)).await;
        let loads = configs.load_count();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(configs.load_count(), loads, "reloads while nothing changed");

        cancel.cancel();
        task.await.unwrap().unwrap();
    }
}
