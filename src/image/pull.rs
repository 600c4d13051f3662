//! Pulling an image into containerd, as containerd's own pull does it: resolve, fetch the
//! index, manifest and config, stream the layers into the content store under a lease,
//! unpack them into the snapshotter by chain ID, label everything for containerd's garbage
//! collector and create the image records CRI clients and `ctr` expect.
//!
//! Layers download concurrently (bounded) and unpack in order as soon as each is in, so
//! downloading and unpacking overlap. Concurrent pulls of the same reference share one pull.
//! A pull that makes no progress for the configured time is cancelled. On failure the lease
//! is deleted with a synchronous garbage collection, so nothing the failed pull wrote stays.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt, Shared};
use futures::{StreamExt, TryStreamExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::task::AbortOnDropHandle;
use tonic::Code;

use super::auth::{Credentials, CredentialsError};
use super::hosts::{self, HostsError};
use super::load::ImageDocuments;
use super::registry::{HttpClients, RegistryError, Resolved, Session};
use super::unpack::{
    Staged, finish_staged, rebase_staged, stage_layer, to_containerd, unpack_layer,
};
use crate::config::RegistryConfig;
use crate::containerd::content::WriteError;
use crate::containerd::{Containerd, ContainerdError};
use crate::imagespec::manifest::{
    Descriptor, ImageConfigFile, Index, Manifest, Platform, chain_ids, is_index, is_manifest,
    sha256_digest,
};
use crate::imagespec::reference::Reference;
use crate::keyed_locks::KeyedLocks;
use crate::store::{Image, ImageStore};

/// The label that marks images crius manages, as containerd's CRI does.
pub use super::labels::MANAGED_LABEL;
use super::labels::{PINNED_LABEL, record_labels};
/// A pull's lease expires by itself after this, should crius die mid-pull.
/// The most layers an image may have: overlayfs stacks no more (a manifest of 8 MiB could
/// name some 90 thousand, each a download task).
const MAX_LAYERS: usize = 500;
const LEASE_EXPIRY: Duration = Duration::from_secs(24 * 3600);
/// The largest image config crius reads (it is held in memory).
const MAX_CONFIG_SIZE: i64 = 8 * 1024 * 1024;
/// How often a running pull logs its progress.
const PROGRESS_LOG_INTERVAL: Duration = Duration::from_secs(5);
/// How often the watchdog looks at a pull.
const WATCH_TICK: Duration = Duration::from_millis(250);
/// New layer bytes that count as progress for the stall timeout.
const USEFUL_BYTES: u64 = 32 * 1024;

/// Why a pull failed, with the gRPC code it maps to. Cloneable: shared by joined pulls.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct PullFailure {
    pub code: Code,
    pub message: String,
}

#[derive(Debug, thiserror::Error)]
enum PullError {
    #[error(transparent)]
    Hosts(#[from] HostsError),
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Containerd(#[from] ContainerdError),
    #[error("{0}")]
    Unsupported(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Corrupt(String),
    /// crius's own fault: a pull task that died, a limiter closed under it.
    #[error("{0}")]
    Internal(String),
    #[error("no progress for {0:?}; cancelled")]
    Stalled(Duration),
    #[error("not done within {limit:?}, the most a pull of {bytes} bytes may take; cancelled")]
    TooSlow { limit: Duration, bytes: u64 },
    #[error("cancelled: every caller's deadline passed")]
    Cancelled,
    #[error(transparent)]
    Failpoint(#[from] crate::failpoint::Triggered),
    #[error(transparent)]
    Unpack(#[from] super::unpack::UnpackError),
}

impl PullError {
    fn code(&self) -> Code {
        match self {
            Self::Hosts(_) | Self::Credentials(_) => Code::FailedPrecondition,
            Self::Registry(e) => match e.kind() {
                RegistryError::NotFound { .. } => Code::NotFound,
                RegistryError::Unauthorized { .. } => Code::Unauthenticated,
                RegistryError::Unreachable { .. } => Code::Unavailable,
                RegistryError::DigestMismatch { .. } => Code::DataLoss,
                RegistryError::Invalid(_) => Code::FailedPrecondition,
                _ => Code::Unknown,
            },
            Self::Containerd(e) => match e.code() {
                Some(Code::Unavailable) => Code::Unavailable,
                _ => Code::Internal,
            },
            Self::Unsupported(_) => Code::InvalidArgument,
            Self::NotFound(_) => Code::NotFound,
            Self::Corrupt(_) => Code::DataLoss,
            Self::Stalled(_) | Self::TooSlow { .. } | Self::Cancelled => Code::DeadlineExceeded,
            Self::Failpoint(_) | Self::Internal(_) => Code::Internal,
            Self::Unpack(
                super::unpack::UnpackError::Containerd(_)
                | super::unpack::UnpackError::Failpoint(_)
                | super::unpack::UnpackError::MoveStaged { .. }
                | super::unpack::UnpackError::NotRebased { .. },
            ) => Code::Internal,
            Self::Unpack(super::unpack::UnpackError::DiffIdMismatch { .. }) => Code::DataLoss,
        }
    }
}

impl<E: std::error::Error + Into<PullError> + 'static> From<WriteError<E>> for PullError {
    fn from(e: WriteError<E>) -> Self {
        match e {
            WriteError::Source(e) => e.into(),
            WriteError::Containerd(e) => e.into(),
            mismatch @ WriteError::Mismatch { .. } => PullError::Corrupt(mismatch.to_string()),
        }
    }
}

/// A pull that fetched at least this much hands the heap's free pages back afterwards.
const RELEASE_AFTER_BYTES: u64 = 1024 * 1024;

/// How far a pull has come; also what the watchdog watches.
///
/// Only useful progress counts: [`USEFUL_BYTES`] more of a layer, or a document or layer
/// finished. A registry that trickles a byte now and then makes none, so it is cut off after
/// the progress timeout like one that sends nothing. Once the documents are in, the pull
/// also gets an overall deadline from the sizes they promised (see [`Progress::promise`]).
struct Progress {
    started: Instant,
    /// Milliseconds after `started` of the last useful progress.
    last: AtomicU64,
    bytes: AtomicU64,
    /// Bytes received since the last useful progress.
    unaccounted: AtomicU64,
    bytes_total: AtomicU64,
    layers: AtomicUsize,
    layers_total: AtomicUsize,
    /// Milliseconds after `started` by which the pull must be done; 0 until promised.
    deadline: AtomicU64,
}

impl Progress {
    fn new() -> Self {
        Self {
            started: Instant::now(),
            last: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            unaccounted: AtomicU64::new(0),
            bytes_total: AtomicU64::new(0),
            layers: AtomicUsize::new(0),
            layers_total: AtomicUsize::new(0),
            deadline: AtomicU64::new(0),
        }
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Records useful progress: a document or layer finished, or enough new bytes.
    fn touch(&self) {
        self.unaccounted.store(0, Ordering::Relaxed);
        self.last.store(self.elapsed_ms(), Ordering::Relaxed);
    }

    fn add_bytes(&self, n: usize) {
        let n = n as u64;
        self.bytes.fetch_add(n, Ordering::Relaxed);
        crate::metrics::metrics().pull_received(n);
        if self.unaccounted.fetch_add(n, Ordering::Relaxed) + n >= USEFUL_BYTES {
            self.touch();
        }
    }

    fn layer_done(&self) {
        self.layers.fetch_add(1, Ordering::Relaxed);
        self.touch();
    }

    /// Sets the overall deadline once the documents say how many bytes are to come: the
    /// progress timeout plus the promised bytes at `min_rate`, from the start. No deadline
    /// with a rate of 0.
    fn promise(&self, bytes: u64, progress_timeout: Duration, min_rate: u64) -> Option<Duration> {
        let limit = overall_limit(bytes, progress_timeout, min_rate)?;
        let ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX).max(1);
        self.deadline.store(ms, Ordering::Relaxed);
        Some(limit)
    }

    fn idle(&self) -> Duration {
        let last = Duration::from_millis(self.last.load(Ordering::Relaxed));
        self.started.elapsed().saturating_sub(last)
    }

    fn past_deadline(&self) -> Option<Duration> {
        let deadline = self.deadline.load(Ordering::Relaxed);
        (deadline != 0 && self.elapsed_ms() >= deadline).then(|| Duration::from_millis(deadline))
    }

    /// Resolves when there has been no useful progress for `timeout`, or the overall
    /// deadline passed; logs progress meanwhile.
    async fn watch(&self, reference: &str, timeout: Duration) -> Stop {
        let tick = WATCH_TICK.min(timeout);
        let (mut last_log, mut last_bytes) = (Instant::now(), 0);
        loop {
            tokio::time::sleep(tick).await;
            if self.idle() >= timeout {
                return Stop::Stalled(timeout);
            }
            if let Some(limit) = self.past_deadline() {
                return Stop::TooSlow {
                    limit,
                    bytes: self.bytes_total.load(Ordering::Relaxed),
                };
            }
            if last_log.elapsed() >= PROGRESS_LOG_INTERVAL {
                let bytes = self.bytes.load(Ordering::Relaxed);
                let rate = (bytes.saturating_sub(last_bytes) as f64
                    / last_log.elapsed().as_secs_f64()) as u64;
                (last_log, last_bytes) = (Instant::now(), bytes);
                tracing::info!(
                    image = reference,
                    bytes,
                    bytes_total = self.bytes_total.load(Ordering::Relaxed),
                    bytes_per_second = rate,
                    layers_done = self.layers.load(Ordering::Relaxed),
                    layers_total = self.layers_total.load(Ordering::Relaxed),
                    elapsed_s = self.started.elapsed().as_secs(),
                    "pull in progress"
                );
            }
        }
    }
}

/// How long a pull of `bytes` may take in all.
/// Never more than the pull's lease lives: sizes a registry claims are not to be trusted.
fn overall_limit(bytes: u64, progress_timeout: Duration, min_rate: u64) -> Option<Duration> {
    let transfer = Duration::from_secs(bytes.checked_div(min_rate)?);
    Some(progress_timeout.saturating_add(transfer).min(LEASE_EXPIRY))
}

/// Why a pull stops before it is done.
#[derive(Debug, Clone, Copy)]
enum Stop {
    /// No useful progress for this long.
    Stalled(Duration),
    /// The overall deadline for the promised bytes passed.
    TooSlow { limit: Duration, bytes: u64 },
    /// Every caller's deadline passed.
    Cancelled,
}

impl From<Stop> for PullError {
    fn from(stop: Stop) -> Self {
        match stop {
            Stop::Stalled(timeout) => Self::Stalled(timeout),
            Stop::TooSlow { limit, bytes } => Self::TooSlow { limit, bytes },
            Stop::Cancelled => Self::Cancelled,
        }
    }
}

type SharedPull = Shared<BoxFuture<'static, Result<Image, PullFailure>>>;

/// A pull in progress: its result, shared by every caller, and how many callers still wait
/// for it under a deadline. When the last of those gives up, the pull is cancelled (and
/// cleans up) rather than finishing for no one.
#[derive(Clone)]
struct InFlight {
    result: SharedPull,
    waiting: Arc<std::sync::atomic::AtomicUsize>,
    cancel: tokio_util::sync::CancellationToken,
}

/// Pulls images; shared by all PullImage calls.
pub struct ImagePuller {
    containerd: Containerd,
    /// The images already pulled: a reference that resolves to one of them is not fetched.
    images: Arc<ImageStore>,
    registry: RegistryConfig,
    max_downloads: usize,
    /// Layers applied at once.
    max_unpacks: usize,
    progress_timeout: Duration,
    /// Bytes a second a whole pull must average; 0: no overall limit.
    min_rate: u64,
    http: HttpClients,
    in_flight: Mutex<HashMap<String, InFlight>>,
    /// Layers being downloaded, by digest: one download of a layer at a time.
    layer_locks: Arc<KeyedLocks>,
}

impl ImagePuller {
    pub fn new(
        containerd: Containerd,
        images: Arc<ImageStore>,
        registry: RegistryConfig,
        max_downloads: usize,
        max_unpacks: usize,
        progress_timeout: Duration,
        min_rate: u64,
    ) -> Arc<Self> {
        Arc::new(Self {
            containerd,
            images,
            registry,
            max_downloads: max_downloads.max(1),
            max_unpacks: max_unpacks.max(1),
            progress_timeout,
            min_rate,
            http: HttpClients::default(),
            in_flight: Mutex::new(HashMap::new()),
            layer_locks: Arc::default(),
        })
    }

    /// Pulls `reference`; a pull of the same reference with the same credentials that is
    /// already running is joined instead of started again. A caller without a deadline, or
    /// one that goes away, lets the pull finish; when every caller's `deadline` has passed,
    /// the pull is cancelled, its content collected, and the caller sees DEADLINE_EXCEEDED.
    /// The layers are unpacked into `snapshotter`.
    pub async fn pull(
        self: &Arc<Self>,
        reference: &Reference,
        credentials: Option<Credentials>,
        snapshotter: &str,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Image, PullFailure> {
        let pull = self.join_or_start(reference, credentials, snapshotter);
        pull.waiting.fetch_add(1, Ordering::SeqCst);
        let Some(at) = deadline else {
            // Never counted out: a caller without a deadline keeps the pull alive.
            return pull.result.await;
        };
        match tokio::time::timeout_at(at, pull.result.clone()).await {
            Ok(result) => {
                pull.waiting.fetch_sub(1, Ordering::SeqCst);
                result
            }
            Err(_) => {
                if pull.waiting.fetch_sub(1, Ordering::SeqCst) == 1 {
                    tracing::info!(image = %reference, "every caller's deadline passed; cancelling the pull");
                    // The pull's task collects what it wrote; a retry starts afresh.
                    pull.cancel.cancel();
                    self.forget(&pull);
                }
                Err(PullFailure {
                    code: Code::DeadlineExceeded,
                    message: format!(
                        "failed to pull image \"{reference}\": the client's deadline passed"
                    ),
                })
            }
        }
    }

    /// Drops `pull` from the pulls in progress (not a newer one under the same key).
    fn forget(&self, pull: &InFlight) {
        self.in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|_, p| !Arc::ptr_eq(&p.waiting, &pull.waiting));
    }

    fn join_or_start(
        self: &Arc<Self>,
        reference: &Reference,
        credentials: Option<Credentials>,
        snapshotter: &str,
    ) -> InFlight {
        let key = pull_key(reference, credentials.as_ref(), snapshotter);
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(pull) = in_flight.get(&key) {
            tracing::debug!(image = %reference, "joining a pull in progress");
            return pull.clone();
        }
        let this = Arc::clone(self);
        let reference = reference.clone();
        let snapshotter = snapshotter.to_string();
        let task_key = key.clone();
        let cancel = tokio_util::sync::CancellationToken::new();
        let task_cancel = cancel.clone();
        // A task of its own: the pull finishes (or cleans up) even if every caller goes away.
        let waiting = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let task_waiting = waiting.clone();
        let task = tokio::spawn(async move {
            let result = this
                .pull_uncached(&reference, credentials, &snapshotter, task_cancel)
                .await;
            let mut in_flight = this.in_flight.lock().unwrap_or_else(|p| p.into_inner());
            if in_flight
                .get(&task_key)
                .is_some_and(|p| Arc::ptr_eq(&p.waiting, &task_waiting))
            {
                in_flight.remove(&task_key);
            }
            result
        });
        let result = async move {
            task.await.unwrap_or_else(|e| {
                Err(PullFailure {
                    code: Code::Internal,
                    message: format!("pull task failed: {e}"),
                })
            })
        }
        .boxed()
        .shared();
        let pull = InFlight {
            result,
            waiting,
            cancel,
        };
        in_flight.insert(key, pull.clone());
        pull
    }

    async fn pull_uncached(
        &self,
        reference: &Reference,
        credentials: Option<Credentials>,
        snapshotter: &str,
        cancel: tokio_util::sync::CancellationToken,
    ) -> Result<Image, PullFailure> {
        let started = Instant::now();
        let timer = crate::metrics::metrics().pull_started();
        let progress = Arc::new(Progress::new());
        let name = reference.to_string();
        // Why the pull must stop before it is done: no useful progress, too slow over all, or
        // no one waiting any more.
        let stop = async {
            tokio::select! {
                why = progress.watch(&name, self.progress_timeout) => why,
                _ = cancel.cancelled() => Stop::Cancelled,
            }
        }
        .boxed()
        .shared();
        let outcome = self
            .pull_with_lease(reference, credentials, snapshotter, &progress, stop)
            .await;
        let fetched = progress.bytes.load(Ordering::Relaxed);
        timer.finish(outcome.is_ok());
        if fetched >= RELEASE_AFTER_BYTES {
            // Layer downloads leave freed buffers behind in the heap; give them back now
            // rather than keep them for the daemon's life.
            tokio::task::spawn_blocking(crate::heap::release_free_memory);
        }
        match outcome {
            Ok(image) => {
                tracing::info!(
                    image = %reference,
                    id = %image.id,
                    size = image.size,
                    bytes_fetched = progress.bytes.load(Ordering::Relaxed),
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "image pulled"
                );
                Ok(image)
            }
            Err(e) => Err(PullFailure {
                code: e.code(),
                message: format!("failed to pull image \"{reference}\": {e}"),
            }),
        }
    }

    /// Resolves and fetches the documents, then writes everything under a lease that is
    /// released when done (collected at once on failure).
    async fn pull_with_lease(
        &self,
        reference: &Reference,
        credentials: Option<Credentials>,
        snapshotter: &str,
        progress: &Arc<Progress>,
        stop: Shared<BoxFuture<'_, Stop>>,
    ) -> Result<Image, PullError> {
        // hosts.toml is read on a blocking thread.
        let (config_path, domain) = (self.registry.config_path.clone(), reference.domain.clone());
        let endpoints =
            tokio::task::spawn_blocking(move || hosts::endpoints(&config_path, &domain))
                .await
                .map_err(|e| {
                    PullError::Unsupported(format!("reading the registry hosts: {e}"))
                })??;
        let mut config_credentials = HashMap::new();
        for (host, settings) in &self.registry.configs {
            if let Some(auth) = &settings.auth {
                config_credentials.insert(host.clone(), Credentials::from_config(auth)?);
            }
        }
        let session = Session::new(
            &self.http,
            reference.clone(),
            endpoints,
            config_credentials,
            credentials,
        )?;
        let resolved = tokio::select! {
            resolved = session.resolve() => resolved?,
            why = stop.clone() => return Err(why.into()),
        };
        progress.touch();
        // Bounded like the rest: it may wait for a RemoveImage of the image. Names it wrote
        // before a stop reach the store through containerd's events.
        let present = tokio::select! {
            present = self.already_present(reference, &resolved, snapshotter) => present?,
            why = stop.clone() => return Err(why.into()),
        };
        if let Some(image) = present {
            return Ok(image);
        }
        // The pull's lease is made while the documents come (a stop cuts the fetch short,
        // never the lease's creation, which is then undone).
        let lease = format!("crius-pull-{:016x}", rand::random::<u64>());
        let docs = async {
            tokio::select! {
                docs = fetch_documents(&session, resolved, progress) => docs,
                why = stop.clone() => Err(why.into()),
            }
        };
        let (docs, leased) =
            futures::future::join(docs, self.containerd.create_lease(&lease, LEASE_EXPIRY)).await;
        let docs = match (docs, leased) {
            (Ok(docs), Ok(())) => docs,
            (Err(e), leased) => {
                if leased.is_ok() {
                    self.forget_lease(&lease).await;
                }
                return Err(e);
            }
            (Ok(_), Err(e)) => return Err(e.into()),
        };
        let promised = docs
            .manifest
            .layers
            .iter()
            .map(|l| u64::try_from(l.size).unwrap_or(0))
            .fold(0u64, u64::saturating_add);
        progress.bytes_total.store(promised, Ordering::Relaxed);
        let limit = progress.promise(promised, self.progress_timeout, self.min_rate);
        tracing::debug!(
            elapsed_ms = progress.started.elapsed().as_millis() as u64,
            limit_ms = limit.map(|l| l.as_millis() as u64),
            "documents fetched"
        );

        // Stopping drops the writes in flight; the lease below still goes, with its content.
        let written = tokio::select! {
            written = self.write_image(&session, reference, &docs, snapshotter, &lease, progress) => written,
            why = stop => Err(why.into()),
        };
        let collect = written.is_err();
        if let Err(e) = self.containerd.delete_lease(&lease, collect).await {
            tracing::warn!(%lease, error = %e, "failed to delete pull lease; it expires by itself");
        }
        written
    }

    /// Deletes a pull's lease that nothing was written under.
    async fn forget_lease(&self, lease: &str) {
        if let Err(e) = self.containerd.delete_lease(lease, false).await {
            tracing::warn!(%lease, error = %e, "failed to delete pull lease; it expires by itself");
        }
    }

    /// The image `resolved` names when it is pulled and unpacked already, as containerd's
    /// pull finds every blob and snapshot present: only the names it lacks are recorded.
    /// containerd's garbage collector keeps what an image record references, so its top
    /// snapshot standing is the one thing checked. A name of it deleted meanwhile by another
    /// client may have taken the content along: then it is pulled as if it were not there.
    async fn already_present(
        &self,
        reference: &Reference,
        resolved: &Resolved,
        snapshotter: &str,
    ) -> Result<Option<Image>, PullError> {
        let by_digest = reference.with_digest(&resolved.digest);
        let mut names = BTreeSet::from([by_digest.clone()]);
        names.extend(reference.tagged());
        // Held until the image is recorded: a RemoveImage of it, or of the image a tag
        // pointed at before, comes before or after.
        let Some(locked) = self.images.resolve_locked(&by_digest, &names).await else {
            return Ok(None);
        };
        let mut image = locked.image.clone();
        names.insert(image.id.clone());
        if !image.references.contains(&by_digest)
            || !self
                .containerd
                .snapshot_exists(snapshotter, &image.chain_id)
                .await?
        {
            return Ok(None);
        }
        let labels = record_labels(names.iter().any(|n| self.images.is_pinned_name(n)));
        let top = top_descriptor(resolved);
        for name in names.difference(&image.references) {
            self.containerd
                .put_image(name, to_containerd(&top), labels.clone())
                .await?;
        }
        crate::failpoint::hit("pull_found_present").await?;
        // `ctr images rm` takes names away without the lock: one of these gone meanwhile may
        // have taken the content with it.
        let recorded = Image {
            references: names.clone(),
            ..image.clone()
        };
        if !self
            .images
            .add_if_none_removed_since(recorded, locked.read.generation)
        {
            tracing::debug!(image = %reference, id = %image.id, "image removed while found present; pulling it again");
            return Ok(None);
        }
        image.references.extend(names);
        tracing::debug!(image = %reference, id = %image.id, "image present; nothing fetched");
        Ok(Some(image))
    }

    async fn write_image(
        &self,
        session: &Arc<Session>,
        reference: &Reference,
        docs: &Documents,
        snapshotter: &str,
        lease: &str,
        progress: &Arc<Progress>,
    ) -> Result<Image, PullError> {
        let chain = chain_ids(&docs.config.rootfs.diff_ids);
        // The documents go in while the layers download: each is a write to containerd's
        // database that would otherwise wait behind the last layer's.
        futures::try_join!(
            self.fetch_and_unpack_layers(session, docs, &chain, snapshotter, lease, progress),
            self.put_documents(docs, &chain, snapshotter, lease),
        )?;
        crate::failpoint::hit("pull_after_unpack").await?;

        let image_id = docs.manifest.config.digest.clone();
        let mut names: BTreeSet<String> = BTreeSet::new();
        if let Some(tagged) = reference.tagged() {
            names.insert(tagged);
        }
        names.insert(reference.with_digest(&docs.top.digest));
        names.insert(image_id.clone());
        let labels = record_labels(names.iter().any(|n| self.images.is_pinned_name(n)));
        // A RemoveImage of this image, or of the one a tag pointed at, comes before the
        // names are written or after they are recorded; a name `ctr images rm` takes away
        // meanwhile may be gone from containerd again by then: the store does not get it
        // back.
        let _names = self.images.lock_names(names.iter().cloned()).await;
        let read = self.images.read_generation();
        let target = to_containerd(&docs.top);
        futures::future::try_join_all((names.iter()).map(|name| {
            self.containerd
                .put_image(name, target.clone(), labels.clone())
        }))
        .await?;
        let image = ImageDocuments {
            target_size: docs.top.size,
            manifest_size: docs.index.as_ref().map(|_| docs.manifest_desc.size),
            manifest: &docs.manifest,
            config: docs.config.clone(),
        }
        .into_image(names);
        let image = if labels.contains_key(PINNED_LABEL) {
            Image {
                pinned_references: image.references.clone(),
                ..image
            }
        } else {
            image
        };
        self.images
            .add_unless_removed_since(image.clone(), read.generation);
        Ok(image)
    }

    /// Downloads the layers concurrently and applies each once it is in, up to
    /// `max_unpacks` at a time: the first onto nothing, the others into staging snapshots
    /// (overlayfs), each made the snapshot on its parent, in order, once that is committed
    /// (in one commit where the snapshotter rebases).
    /// Other snapshotters apply the layers one after another, in order.
    async fn fetch_and_unpack_layers(
        &self,
        session: &Arc<Session>,
        docs: &Documents,
        chain: &[String],
        snapshotter: &str,
        lease: &str,
        progress: &Arc<Progress>,
    ) -> Result<(), PullError> {
        let layers = &docs.manifest.layers;
        progress.layers_total.store(layers.len(), Ordering::Relaxed);
        let unpack_slots = Arc::new(Semaphore::new(self.max_unpacks));
        let pending: Vec<PendingLayer> = self
            .start_downloads(session, docs, lease, progress)
            .into_iter()
            .enumerate()
            .map(|(i, download)| {
                if i == 0 || self.max_unpacks < 2 {
                    return PendingLayer::Download(download);
                }
                let stage = StageLayer {
                    containerd: self.containerd.clone(),
                    snapshotter: snapshotter.to_string(),
                    lease: lease.to_string(),
                    layer: layers[i].clone(),
                    diff_id: docs.config.rootfs.diff_ids[i].clone(),
                    chain_id: chain[i].clone(),
                    index: i,
                    progress: Arc::clone(progress),
                };
                let slots = Arc::clone(&unpack_slots);
                PendingLayer::Staging(AbortOnDropHandle::new(tokio::spawn(
                    stage.run(download, slots),
                )))
            })
            .collect();

        // Asked while the first layers download, where layers are staged at all.
        let stages = layers.len() > 1 && self.max_unpacks > 1 && snapshotter == "overlayfs";
        let rebase = stages && self.containerd.snapshotter_can_rebase(snapshotter).await;
        if stages {
            tracing::debug!(
                rebase,
                "staged layers are committed onto their parents by the snapshotter (rebase) or moved"
            );
        }
        let mut parent = String::new();
        for (i, pending) in pending.into_iter().enumerate() {
            let staged = match pending {
                PendingLayer::Download(download) => {
                    downloaded(download, i, progress).await?;
                    Staged::Unsupported
                }
                PendingLayer::Staging(stage) => stage
                    .await
                    .map_err(|e| PullError::Internal(format!("layer staging task: {e}")))??,
            };
            let (layer, diff_id) = (&layers[i], &docs.config.rootfs.diff_ids[i]);
            match staged {
                Staged::Present => {}
                Staged::Ready(staged) if rebase => {
                    rebase_staged(
                        &self.containerd,
                        snapshotter,
                        lease,
                        &staged,
                        &chain[i],
                        &parent,
                    )
                    .await?
                }
                Staged::Ready(staged) => {
                    finish_staged(
                        &self.containerd,
                        snapshotter,
                        lease,
                        layer,
                        &staged,
                        &chain[i],
                        &parent,
                    )
                    .await?
                }
                Staged::Unsupported => {
                    let _slot = unpack_slots
                        .acquire()
                        .await
                        .map_err(|_| PullError::Internal("unpack limiter closed".to_string()))?;
                    unpack_layer(
                        &self.containerd,
                        snapshotter,
                        lease,
                        layer,
                        diff_id,
                        &chain[i],
                        &parent,
                    )
                    .await?
                }
            }
            progress.layer_done();
            tracing::debug!(
                layer = i,
                elapsed_ms = progress.started.elapsed().as_millis() as u64,
                "layer unpacked"
            );
            parent = chain[i].clone();
        }
        Ok(())
    }

    /// Starts every layer's download, at most `max_downloads` at a time.
    fn start_downloads(
        &self,
        session: &Arc<Session>,
        docs: &Documents,
        lease: &str,
        progress: &Arc<Progress>,
    ) -> Vec<AbortOnDropHandle<Result<(), PullError>>> {
        let semaphore = Arc::new(Semaphore::new(self.max_downloads));
        (docs.manifest.layers.iter())
            .zip(&docs.config.rootfs.diff_ids)
            .map(|(layer, diff_id)| {
                let download = LayerDownload {
                    containerd: self.containerd.clone(),
                    session: Arc::clone(session),
                    endpoint: docs.endpoint,
                    lease: lease.to_string(),
                    layer: layer.clone(),
                    diff_id: diff_id.clone(),
                    progress: Arc::clone(progress),
                    layer_locks: Arc::clone(&self.layer_locks),
                };
                let semaphore = Arc::clone(&semaphore);
                AbortOnDropHandle::new(tokio::spawn(async move {
                    let slot = semaphore
                        .acquire_owned()
                        .await
                        .map_err(|_| PullError::Internal("download limiter closed".to_string()))?;
                    download.run(slot).await
                }))
            })
            .collect()
    }

    /// Stores the image's config, manifest and index under the pull's lease, each with
    /// the GC labels that keep what it references (the config: the top snapshot).
    async fn put_documents(
        &self,
        docs: &Documents,
        chain: &[String],
        snapshotter: &str,
        lease: &str,
    ) -> Result<(), PullError> {
        let snapshot_label = format!("containerd.io/gc.ref.snapshot.{snapshotter}");
        let top_chain = chain.last().cloned().unwrap_or_default();
        let config_labels = HashMap::from([(snapshot_label, top_chain)]);
        let index = async {
            match &docs.index {
                Some((desc, bytes, index)) => {
                    self.put_document(lease, desc, bytes, index_gc_labels(index))
                        .await
                }
                None => Ok(()),
            }
        };
        futures::try_join!(
            self.put_document(
                lease,
                &docs.manifest.config,
                &docs.config_bytes,
                config_labels,
            ),
            self.put_document(
                lease,
                &docs.manifest_desc,
                &docs.manifest_bytes,
                manifest_gc_labels(&docs.manifest),
            ),
            index,
        )?;
        Ok(())
    }

    /// Stores a small document (manifest, index, config) with its GC labels.
    async fn put_document(
        &self,
        lease: &str,
        desc: &Descriptor,
        data: &Bytes,
        labels: HashMap<String, String>,
    ) -> Result<(), PullError> {
        self.containerd
            .put_blob(lease, &desc.digest, data.clone(), labels)
            .await
            .map_err(|e| match e {
                WriteError::Containerd(e) => PullError::Containerd(e),
                other => PullError::Corrupt(other.to_string()),
            })
    }
}

/// Everything fetched before anything is written.
struct Documents {
    /// What the reference resolved to (index or manifest).
    top: Descriptor,
    endpoint: usize,
    index: Option<(Descriptor, Bytes, Index)>,
    manifest_desc: Descriptor,
    manifest_bytes: Bytes,
    manifest: Manifest,
    config_bytes: Bytes,
    config: ImageConfigFile,
}

/// The descriptor of what a reference resolved to.
fn top_descriptor(resolved: &Resolved) -> Descriptor {
    Descriptor {
        media_type: resolved.media_type.clone(),
        digest: resolved.digest.clone(),
        size: resolved.data.len() as i64,
        platform: None,
        annotations: HashMap::new(),
    }
}

async fn fetch_documents(
    session: &Session,
    resolved: Resolved,
    progress: &Progress,
) -> Result<Documents, PullError> {
    let top = top_descriptor(&resolved);
    let (index, manifest_desc, manifest_bytes) = if is_index(&resolved.media_type) {
        let index: Index = serde_json::from_slice(&resolved.data)
            .map_err(|e| PullError::Corrupt(format!("index {}: {e}", resolved.digest)))?;
        let platform = Platform::host();
        let chosen = index.select(&platform).cloned().ok_or_else(|| {
            PullError::NotFound(format!(
                "no image for platform {}/{} in index {}",
                platform.os, platform.architecture, resolved.digest
            ))
        })?;
        let (media_type, data) = session
            .fetch_manifest(resolved.endpoint, &chosen.digest)
            .await?;
        let desc = Descriptor {
            media_type: if media_type.is_empty() {
                chosen.media_type.clone()
            } else {
                media_type
            },
            ..chosen
        };
        (
            Some((top.clone(), resolved.data.clone(), index)),
            desc,
            data,
        )
    } else if is_manifest(&resolved.media_type) {
        (None, top.clone(), resolved.data.clone())
    } else {
        return Err(PullError::Unsupported(format!(
            "unsupported manifest media type {:?}",
            resolved.media_type
        )));
    };
    let manifest: Manifest = serde_json::from_slice(&manifest_bytes)
        .map_err(|e| PullError::Corrupt(format!("manifest {}: {e}", manifest_desc.digest)))?;
    if manifest.layers.len() > MAX_LAYERS {
        return Err(PullError::Unsupported(format!(
            "manifest {} has {} layers; overlayfs stacks at most {MAX_LAYERS}",
            manifest_desc.digest,
            manifest.layers.len()
        )));
    }
    let config_bytes = fetch_small_blob(session, resolved.endpoint, &manifest.config).await?;
    let config: ImageConfigFile = serde_json::from_slice(&config_bytes)
        .map_err(|e| PullError::Corrupt(format!("config {}: {e}", manifest.config.digest)))?;
    if config.rootfs.diff_ids.len() != manifest.layers.len() {
        return Err(PullError::Corrupt(format!(
            "manifest {} has {} layers but its config lists {} diff IDs",
            manifest_desc.digest,
            manifest.layers.len(),
            config.rootfs.diff_ids.len()
        )));
    }
    progress.touch();
    Ok(Documents {
        top,
        endpoint: resolved.endpoint,
        index,
        manifest_desc,
        manifest_bytes,
        manifest,
        config_bytes,
        config,
    })
}

/// Fetches a config blob into memory, checking its digest.
async fn fetch_small_blob(
    session: &Session,
    endpoint: usize,
    desc: &Descriptor,
) -> Result<Bytes, PullError> {
    if !(0..=MAX_CONFIG_SIZE).contains(&desc.size) {
        return Err(RegistryError::Invalid(format!(
            "config {} claims {} bytes; crius reads at most {MAX_CONFIG_SIZE}",
            desc.digest, desc.size
        ))
        .into());
    }
    // No more than the descriptor promised: a registry that keeps sending is cut off.
    let limit = desc.size as usize;
    let mut stream = std::pin::pin!(session.fetch_blob(endpoint, &desc.digest).await?);
    let mut data = bytes::BytesMut::with_capacity(limit);
    while let Some(chunk) = stream.try_next().await? {
        if data.len() + chunk.len() > limit {
            return Err(RegistryError::Invalid(format!(
                "config {} is longer than the {limit} bytes its descriptor says",
                desc.digest
            ))
            .into());
        }
        data.extend_from_slice(&chunk);
    }
    let data = data.freeze();
    let actual = sha256_digest(&data);
    if actual != desc.digest {
        return Err(RegistryError::DigestMismatch {
            what: "config",
            digest: desc.digest.clone(),
            actual,
        }
        .into());
    }
    Ok(data)
}

/// A layer on its way: downloading (to be applied on its parent), or downloading and then
/// staged ahead of its parent.
enum PendingLayer {
    Download(AbortOnDropHandle<Result<(), PullError>>),
    Staging(AbortOnDropHandle<Result<Staged, PullError>>),
}

/// Waits for a layer's download.
async fn downloaded(
    download: AbortOnDropHandle<Result<(), PullError>>,
    index: usize,
    progress: &Progress,
) -> Result<(), PullError> {
    download
        .await
        .map_err(|e| PullError::Internal(format!("layer download task: {e}")))??;
    tracing::debug!(
        layer = index,
        elapsed_ms = progress.started.elapsed().as_millis() as u64,
        "layer downloaded"
    );
    Ok(())
}

/// A layer applied ahead of its parent once its download is in.
struct StageLayer {
    containerd: Containerd,
    snapshotter: String,
    lease: String,
    layer: Descriptor,
    diff_id: String,
    chain_id: String,
    index: usize,
    progress: Arc<Progress>,
}

impl StageLayer {
    async fn run(
        self,
        download: AbortOnDropHandle<Result<(), PullError>>,
        slots: Arc<Semaphore>,
    ) -> Result<Staged, PullError> {
        downloaded(download, self.index, &self.progress).await?;
        let _slot = slots
            .acquire_owned()
            .await
            .map_err(|_| PullError::Internal("unpack limiter closed".to_string()))?;
        let staged = stage_layer(
            &self.containerd,
            &self.snapshotter,
            &self.lease,
            &self.layer,
            &self.diff_id,
            &self.chain_id,
        )
        .await?;
        tracing::debug!(
            layer = self.index,
            elapsed_ms = self.progress.started.elapsed().as_millis() as u64,
            staged = matches!(staged, Staged::Ready(_)),
            "layer applied ahead of its parent"
        );
        Ok(staged)
    }
}

/// One layer's download into the content store.
struct LayerDownload {
    containerd: Containerd,
    session: Arc<Session>,
    endpoint: usize,
    lease: String,
    layer: Descriptor,
    diff_id: String,
    progress: Arc<Progress>,
    /// Layers being downloaded, by digest (shared by every pull).
    layer_locks: Arc<KeyedLocks>,
}

impl LayerDownload {
    /// Downloads the layer, holding a download `slot` until the registry has sent it all
    /// (not while containerd commits it: the next layer's download starts meanwhile).
    async fn run(self, slot: OwnedSemaphorePermit) -> Result<(), PullError> {
        let digest = &self.layer.digest;
        // One download of a layer at a time in this crius: a second pull of it waits, then
        // finds the blob in containerd.
        let _downloading = self.layer_locks.lock(digest).await;
        // A blob containerd has not got is downloaded into an unnamed file on its store's
        // filesystem; one it has is only opened (which puts it under the pull's lease, or
        // shares it from another namespace), never fetched.
        if let Ok(None) = self.containerd.content_info(digest).await
            && let Some(unnamed) = self.containerd.unnamed_blob(digest).await
        {
            let stream = self.session.fetch_blob(self.endpoint, digest).await?;
            let progress = Arc::clone(&self.progress);
            return unnamed
                .write_and_record(
                    &self.lease,
                    &self.ingest_ref(),
                    self.layer.size,
                    self.labels(),
                    self.releasing_slot_at_end(stream.boxed(), slot),
                    move |n| progress.add_bytes(n),
                )
                .await
                .map_err(layer_write_error);
        }
        self.write_through_ingest(slot).await
    }

    /// Downloads the layer into an ingest containerd opens (see
    /// [`crate::containerd::content::ContentWriter::write_all`]).
    async fn write_through_ingest(&self, slot: OwnedSemaphorePermit) -> Result<(), PullError> {
        let digest = &self.layer.digest;
        let ingest = self.ingest_ref();
        let labels = self.labels();
        loop {
            let opened = self
                .containerd
                .open_writer(&self.lease, &ingest, digest, self.layer.size)
                .await;
            let writer = match opened {
                Ok(None) => return Ok(()),
                // Shared from another namespace: no transfer needed.
                Ok(Some(writer)) if writer.is_complete() => {
                    return Ok(writer.commit(labels).await?);
                }
                Ok(Some(writer)) => writer,
                // Another pull is writing the same layer: wait for it, then look again.
                Err(e) if e.is_locked() => {
                    tracing::debug!(%digest, "layer is being written by another pull; waiting");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let stream = match self.session.fetch_blob(self.endpoint, digest).await {
                Ok(stream) => stream.boxed(),
                Err(e) => {
                    self.containerd.abort_ingest(&ingest).await;
                    return Err(e.into());
                }
            };
            let progress = Arc::clone(&self.progress);
            return writer
                .write_all(self.releasing_slot_at_end(stream, slot), labels, move |n| {
                    progress.add_bytes(n)
                })
                .await
                .map_err(layer_write_error);
        }
    }

    /// The ingest the layer is recorded through.
    fn ingest_ref(&self) -> String {
        format!("crius-layer-{}", self.layer.digest)
    }

    /// The labels the layer's blob is recorded with: its uncompressed digest.
    fn labels(&self) -> HashMap<String, String> {
        HashMap::from([(
            "containerd.io/uncompressed".to_string(),
            self.diff_id.clone(),
        )])
    }

    /// The layer's bytes from the registry, letting go of the download `slot` once the
    /// registry has sent them all.
    fn releasing_slot_at_end(&self, stream: BlobStream, slot: OwnedSemaphorePermit) -> BlobStream {
        let mut slot = Some(slot);
        stream
            .chain(futures::stream::poll_fn(move |_| {
                slot.take();
                Poll::Ready(None)
            }))
            .boxed()
    }
}

/// A blob's bytes as the registry sends them.
type BlobStream = futures::stream::BoxStream<'static, Result<Bytes, RegistryError>>;

fn layer_write_error(e: WriteError<RegistryError>) -> PullError {
    match e {
        WriteError::Source(e) => PullError::Registry(e),
        WriteError::Containerd(e) => PullError::Containerd(e),
        mismatch => PullError::Corrupt(format!("layer {mismatch}")),
    }
}

/// containerd's GC references from a manifest to its config and layers.
fn manifest_gc_labels(manifest: &Manifest) -> HashMap<String, String> {
    let mut labels = HashMap::from([(
        "containerd.io/gc.ref.content.config".to_string(),
        manifest.config.digest.clone(),
    )]);
    for (i, layer) in manifest.layers.iter().enumerate() {
        labels.insert(
            format!("containerd.io/gc.ref.content.l.{i}"),
            layer.digest.clone(),
        );
    }
    labels
}

/// containerd's GC references from an index to its manifests.
fn index_gc_labels(index: &Index) -> HashMap<String, String> {
    index
        .manifests
        .iter()
        .enumerate()
        .map(|(i, m)| {
            (
                format!("containerd.io/gc.ref.content.m.{i}"),
                m.digest.clone(),
            )
        })
        .collect()
}

/// Joined pulls must also agree on credentials (a fingerprint, never the secrets) and on
/// the snapshotter they unpack into.
fn pull_key(reference: &Reference, credentials: Option<&Credentials>, snapshotter: &str) -> String {
    let fingerprint = credentials
        .map(|c| {
            sha256_digest(
                format!(
                    "{}\0{}\0{}\0{}",
                    c.username, c.password, c.identity_token, c.registry_token
                )
                .as_bytes(),
            )
        })
        .unwrap_or_default();
    format!("{reference}|{fingerprint}|{snapshotter}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trickle_of_bytes_is_not_progress_but_a_useful_amount_is() {
        let progress = Progress::new();
        std::thread::sleep(Duration::from_millis(30));
        for _ in 0..1000 {
            progress.add_bytes(1);
        }
        assert!(
            progress.idle() >= Duration::from_millis(30),
            "a trickle counted"
        );
        progress.add_bytes(USEFUL_BYTES as usize);
        assert!(
            progress.idle() < Duration::from_millis(30),
            "a useful amount did not count"
        );
    }

    #[test]
    fn the_overall_limit_follows_the_promised_bytes_and_is_capped() {
        let timeout = Duration::from_secs(60);
        let rate = 64 * 1024;
        assert_eq!(overall_limit(0, timeout, rate), Some(timeout));
        assert_eq!(
            overall_limit(10 * rate, timeout, rate),
            Some(timeout + Duration::from_secs(10))
        );
        assert_eq!(overall_limit(u64::MAX, timeout, rate), Some(LEASE_EXPIRY));
        assert_eq!(overall_limit(u64::MAX, timeout, 0), None, "0: no limit");
        let progress = Progress::new();
        assert_eq!(
            progress.past_deadline(),
            None,
            "no deadline before the promise"
        );
        progress.promise(0, Duration::ZERO, rate);
        std::thread::sleep(Duration::from_millis(5));
        assert!(progress.past_deadline().is_some());
    }

    #[test]
    fn gc_labels_reference_every_child() {
        let manifest: Manifest = serde_json::from_str(
            r#"{"config":{"digest":"sha256:c","size":1},
                "layers":[{"digest":"sha256:l0","size":1},{"digest":"sha256:l1","size":1}]}"#,
        )
        .unwrap();
        let labels = manifest_gc_labels(&manifest);
        assert_eq!(labels["containerd.io/gc.ref.content.config"], "sha256:c");
        assert_eq!(labels["containerd.io/gc.ref.content.l.1"], "sha256:l1");
        assert_eq!(labels.len(), 3);
    }

    #[test]
    fn pull_keys_differ_by_credentials_fingerprint_and_snapshotter() {
        let r = Reference::parse("busybox").unwrap();
        let creds = Credentials {
            username: "u".into(),
            password: "secret".into(),
            ..Default::default()
        };
        let with = pull_key(&r, Some(&creds), "overlayfs");
        assert_ne!(with, pull_key(&r, None, "overlayfs"));
        assert!(!with.contains("secret"));
        assert_ne!(
            pull_key(&r, None, "native"),
            pull_key(&r, None, "overlayfs")
        );
    }
}
