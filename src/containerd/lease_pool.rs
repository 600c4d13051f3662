//! Leases for creating containers and sandboxes, made ahead of time.
//!
//! A creation holds a lease from its snapshot's prepare until containerd's record of the
//! container holds the snapshot. Making that lease is one more containerd commit on the
//! request's path; the pool keeps one made ahead and makes the next once a creation is
//! done with containerd, so creations one after another (kubelet creates a pod's
//! containers one by one) wait for none. Each lease expires by itself, and start-up
//! deletes every lease crius left (see `recovery::clean_up_leftovers`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::{Containerd, ContainerdError};

/// When containerd's garbage collection drops a lease nobody deleted.
const LEASE_EXPIRY: Duration = Duration::from_secs(3600);
/// The first and the longest pause between attempts to delete a lease containerd could not
/// delete.
const DELETE_RETRY_FIRST: Duration = Duration::from_millis(500);
const DELETE_RETRY_MAX: Duration = Duration::from_secs(30);
/// A ready lease older than this is not handed out: it could expire under its creation.
const HAND_OUT_WITHIN: Duration = Duration::from_secs(1800);

pub struct LeasePool {
    containerd: Containerd,
    ready: Mutex<Option<ReadyLease>>,
    filling: AtomicBool,
}

struct ReadyLease {
    id: String,
    made: Instant,
}

impl LeasePool {
    /// An empty pool: the first creation makes its own lease.
    pub fn new(containerd: Containerd) -> Arc<Self> {
        Arc::new(Self {
            containerd,
            ready: Mutex::new(None),
            filling: AtomicBool::new(false),
        })
    }

    /// A lease for one creation: the one made ahead, or a new one when none is ready.
    pub async fn take(self: &Arc<Self>) -> Result<String, ContainerdError> {
        let ready = self.slot().take();
        match ready {
            Some(lease) if lease.made.elapsed() < HAND_OUT_WITHIN => Ok(lease.id),
            stale => {
                if let Some(old) = stale {
                    let pool = self.clone();
                    tokio::spawn(async move { pool.delete(&old.id).await });
                }
                let id = new_lease_id();
                self.containerd.create_lease(&id, LEASE_EXPIRY).await?;
                Ok(id)
            }
        }
    }

    /// Ends a creation's lease (the container record holds what it needed, or the
    /// creation failed) and makes the next one in the background.
    pub async fn finish(self: &Arc<Self>, lease: &str) {
        self.delete(lease).await;
        self.refill();
    }

    /// Whether a lease is ready to be handed out.
    fn has_ready(&self) -> bool {
        self.slot().is_some()
    }

    /// Deletes `lease`; when containerd cannot (it is restarting), again in the background
    /// until it can, rather than leave the lease (and what it holds) for its hour.
    async fn delete(self: &Arc<Self>, lease: &str) {
        if let Err(e) = self.try_delete(lease).await {
            tracing::warn!(%lease, error = %e, "failed to delete a creation lease; trying again in the background");
            let (pool, lease) = (self.clone(), lease.to_string());
            tokio::spawn(async move { pool.delete_later(&lease).await });
        }
    }

    async fn try_delete(&self, lease: &str) -> Result<(), ContainerdError> {
        // Stands for containerd restarting.
        crate::failpoint::hit("lease_pool_delete")
            .await
            .map_err(|e| ContainerdError::Rpc {
                op: "delete lease",
                status: tonic::Status::unavailable(e.to_string()),
            })?;
        self.containerd.delete_lease(lease, false).await
    }

    async fn delete_later(&self, lease: &str) {
        let mut pause = DELETE_RETRY_FIRST;
        let until = Instant::now() + LEASE_EXPIRY;
        while Instant::now() < until {
            tokio::time::sleep(pause).await;
            match self.try_delete(lease).await {
                Ok(()) => {
                    tracing::info!(%lease, "creation lease deleted");
                    return;
                }
                Err(e) => tracing::debug!(%lease, error = %e, "creation lease not deleted yet"),
            }
            pause = (pause * 2).min(DELETE_RETRY_MAX);
        }
    }

    fn refill(self: &Arc<Self>) {
        if self.has_ready() || self.filling.swap(true, Ordering::AcqRel) {
            return;
        }
        let pool = self.clone();
        tokio::spawn(async move {
            let id = new_lease_id();
            match pool.containerd.create_lease(&id, LEASE_EXPIRY).await {
                Ok(()) => {
                    let made = ReadyLease {
                        id,
                        made: Instant::now(),
                    };
                    let extra = pool.slot().replace(made);
                    if let Some(extra) = extra {
                        pool.delete(&extra.id).await;
                    }
                }
                Err(e) => tracing::debug!(error = %e, "cannot make a creation lease ahead"),
            }
            pool.filling.store(false, Ordering::Release);
        });
    }

    fn slot(&self) -> MutexGuard<'_, Option<ReadyLease>> {
        self.ready.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// `crius-create-<16 hex>`: crius's prefix, so start-up finds it among the leftovers.
fn new_lease_id() -> String {
    format!("crius-create-{:016x}", rand::random::<u64>())
}
