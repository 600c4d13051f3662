//! containerd's garbage collection after an image is removed, off the request path.
//!
//! `RemoveImage` deletes the image's names and answers; the content and snapshots nothing
//! references any more are collected by one task right after. Removals that come while a
//! collection runs are served by one more run, so kubelet's image garbage collector, which
//! removes images one by one, makes containerd collect once or twice instead of once per
//! image. Nothing observable waits on it: `ImageFsInfo` reports the usage measured every
//! stats period (as containerd's CRI does), and kubelet counts what its image collection
//! frees by the removed images' sizes. A pull that runs meanwhile holds what it reuses under
//! its lease. What a crash leaves uncollected is collected when crius starts again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::containerd::{Containerd, ContainerdError};

#[derive(Debug, thiserror::Error)]
enum CollectError {
    #[error(transparent)]
    Containerd(#[from] ContainerdError),
    #[error(transparent)]
    Failpoint(#[from] crate::failpoint::Triggered),
}

/// The lease that triggers a collection expires by itself after this long, should crius
/// stop between making and deleting it.
const TRIGGER_LEASE_EXPIRY: Duration = Duration::from_secs(60);
/// How long a failed collection waits before it is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(10);

/// Asks for collections; cheap to clone.
#[derive(Clone, Default)]
pub struct ContentCollector {
    wanted: Arc<Notify>,
}

impl ContentCollector {
    /// Asks for a collection after what was deleted so far. Returns at once; asks made
    /// while a collection runs add up to one more run.
    pub fn request(&self) {
        self.wanted.notify_one();
    }

    /// Collects once at start, then once per request (or batch of requests), until
    /// cancelled. A failed collection is tried again after [`RETRY_AFTER`].
    pub async fn run(&self, containerd: Containerd, cancel: CancellationToken) {
        let mut pending = true;
        loop {
            if pending {
                let collected = tokio::select! {
                    _ = cancel.cancelled() => return,
                    collected = collect(&containerd) => collected,
                };
                pending = match collected {
                    Ok(took) => {
                        tracing::debug!(took_ms = took.as_millis() as u64, "content collected");
                        false
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "garbage collection after an image removal failed; trying again");
                        true
                    }
                };
            }
            let retry = async {
                if pending {
                    tokio::time::sleep(RETRY_AFTER).await
                } else {
                    std::future::pending().await
                }
            };
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = self.wanted.notified() => pending = true,
                _ = retry => {}
            }
        }
    }
}

/// Makes containerd collect garbage now and waits for it: deleting a lease synchronously
/// is the one API call that runs a collection without deleting anything else.
async fn collect(containerd: &Containerd) -> Result<Duration, CollectError> {
    crate::failpoint::hit("content_collect").await?;
    let started = Instant::now();
    let lease = format!("crius-collect-{:016x}", rand::random::<u64>());
    containerd
        .create_lease(&lease, TRIGGER_LEASE_EXPIRY)
        .await?;
    containerd.delete_lease(&lease, true).await?;
    Ok(started.elapsed())
}
