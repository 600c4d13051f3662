//! The containerd event monitor: keeps crius's stores in step with what happens in
//! containerd. It follows image events (records created, updated or deleted by crius, `ctr`
//! or anyone else) and task exits, which it hands to a [`TaskExitHandler`]. It resubscribes
//! with backoff when the stream breaks and then re-syncs, so changes made while it was
//! disconnected are not lost.

use std::sync::Arc;
use std::time::Duration;

use containerd_client::events::{TaskExit, TaskOom};
use containerd_client::services::v1::{
    ImageCreate, ImageDelete, ImageUpdate, PublishRequest, SubscribeRequest,
};
use containerd_client::types::Envelope;

use futures::StreamExt;
use prost::Message;
use tokio_util::sync::CancellationToken;

use crate::containerd::Containerd;
use crate::image::load::sync_record;
use crate::store::ImageStore;

const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// crius's own event, published until a subscription is answered.
const PING_TOPIC: &str = "/crius/ping";
const PING_INTERVAL: Duration = Duration::from_millis(250);
/// How often, and how far apart, tasks that could not be re-checked are tried again.
const RESYNC_RETRIES: u32 = 30;
const RESYNC_RETRY_INTERVAL: Duration = Duration::from_secs(1);

/// A task process that exited.
#[derive(Debug, Clone)]
pub struct TaskExitEvent {
    pub container_id: String,
    /// The process: the container ID for the init process, else the exec ID.
    pub id: String,
    pub pid: u32,
    pub exit_status: u32,
    pub exited_at: std::time::SystemTime,
}

/// Reacts to task exits (sandboxes and containers).
#[async_trait::async_trait]
pub trait TaskExitHandler: Send + Sync {
    async fn task_exited(&self, event: TaskExitEvent);
    /// containerd saw the OOM killer hit a task of the container.
    async fn task_oom(&self, container_id: &str);
    /// Called after a gap in the event stream: re-check every task. Returns how many
    /// could not be asked about (containerd may still be settling after a restart).
    async fn resync_tasks(&self) -> usize;
    /// The event stream broke (`false`) or stands again (`true`).
    fn containerd_reachable(&self, _reachable: bool) {}
}

/// Follows containerd's events for crius's namespace.
pub struct EventMonitor {
    containerd: Containerd,
    images: Arc<ImageStore>,
    exits: Arc<dyn TaskExitHandler>,
}

impl EventMonitor {
    pub fn new(
        containerd: Containerd,
        images: Arc<ImageStore>,
        exits: Arc<dyn TaskExitHandler>,
    ) -> Self {
        Self {
            containerd,
            images,
            exits,
        }
    }

    /// Runs until `cancel` fires.
    pub async fn run(self, cancel: CancellationToken) -> Result<(), crate::failpoint::Triggered> {
        crate::failpoint::hit("event_monitor").await?;
        let mut backoff = Duration::from_millis(100);
        let mut first = true;
        let mut retry: Option<tokio::task::JoinHandle<()>> = None;
        loop {
            let namespace = self.containerd.namespace();
            let filters = vec![
                format!("namespace==\"{namespace}\",topic~=\"^/images/\""),
                format!("namespace==\"{namespace}\",topic==\"/tasks/exit\""),
                format!("namespace==\"{namespace}\",topic==\"/tasks/oom\""),
                format!("namespace==\"{namespace}\",topic==\"{PING_TOPIC}\""),
            ];
            let Some(subscribed) = self.subscribe(filters, &cancel).await else {
                return Ok(());
            };
            let mut stream = match subscribed {
                Ok(resp) => resp.into_inner(),
                Err(status) => {
                    self.exits.containerd_reachable(false);
                    tracing::warn!(error = %status, retry_in = ?backoff, "cannot subscribe to containerd events");
                    tokio::select! {
                        _ = cancel.cancelled() => return Ok(()),
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    continue;
                }
            };
            backoff = Duration::from_millis(100);
            self.exits.containerd_reachable(true);
            if !first {
                tracing::info!("resubscribed to containerd events; re-syncing images and tasks");
                self.resync_images().await;
                if let Some(earlier) = retry.take() {
                    earlier.abort();
                }
                let unchecked = self.exits.resync_tasks().await;
                if unchecked > 0 {
                    retry = Some(self.retry_resync(unchecked, cancel.clone()));
                }
            }
            first = false;
            loop {
                let next = tokio::select! {
                    _ = cancel.cancelled() => return Ok(()),
                    next = stream.next() => next,
                };
                match next {
                    Some(Ok(envelope)) => self.handle(envelope).await,
                    Some(Err(status)) => {
                        tracing::warn!(error = %status, "containerd event stream broke");
                        self.exits.containerd_reachable(false);
                        break;
                    }
                    None => {
                        tracing::warn!("containerd event stream ended");
                        self.exits.containerd_reachable(false);
                        break;
                    }
                }
            }
        }
    }

    /// Subscribes; `None` when cancelled. containerd answers a subscription only with its
    /// first event, so until then crius publishes a ping of its own every
    /// `PING_INTERVAL`: the answer then proves the subscription live, and a re-sync after
    /// it cannot miss an exit (nor wait for the next event to happen).
    async fn subscribe(
        &self,
        filters: Vec<String>,
        cancel: &CancellationToken,
    ) -> Option<Result<tonic::Response<tonic::Streaming<Envelope>>, tonic::Status>> {
        let mut client = self.containerd.events();
        let subscribe = client.subscribe(SubscribeRequest { filters });
        tokio::pin!(subscribe);
        let mut ping =
            tokio::time::interval_at(tokio::time::Instant::now() + PING_INTERVAL, PING_INTERVAL);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return None,
                subscribed = &mut subscribe => return Some(subscribed),
                _ = ping.tick() => self.publish_ping().await,
            }
        }
    }

    async fn publish_ping(&self) {
        let request = PublishRequest {
            topic: PING_TOPIC.to_string(),
            event: Some(prost_types::Any {
                type_url: "type.googleapis.com/google.protobuf.Empty".to_string(),
                value: Vec::new(),
            }),
        };
        if let Err(e) = self.containerd.events().publish(request).await {
            tracing::debug!(error = %e, "cannot publish a ping event");
        }
    }

    /// Re-checks the tasks again, a second apart, until every one could be asked about:
    /// an exit missed in the gap must not leave a container RUNNING for good.
    fn retry_resync(
        &self,
        mut unchecked: usize,
        cancel: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let exits = self.exits.clone();
        tokio::spawn(async move {
            for attempt in 1..=RESYNC_RETRIES {
                tracing::info!(
                    unchecked,
                    attempt,
                    "re-checking tasks that could not be asked about"
                );
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(RESYNC_RETRY_INTERVAL) => {}
                }
                unchecked = exits.resync_tasks().await;
                if unchecked == 0 {
                    return;
                }
            }
            tracing::warn!(
                unchecked,
                "gave up re-checking tasks after a containerd gap"
            );
        })
    }

    async fn handle(&self, envelope: Envelope) {
        let Some(event) = envelope.event else { return };
        if envelope.topic == "/tasks/oom" {
            match TaskOom::decode(event.value.as_slice()) {
                Ok(oom) => self.exits.task_oom(&oom.container_id).await,
                Err(e) => tracing::warn!(error = %e, "undecodable task OOM event"),
            }
            return;
        }
        if envelope.topic == "/tasks/exit" {
            match TaskExit::decode(event.value.as_slice()) {
                Ok(exit) => {
                    let exited_at = exit
                        .exited_at
                        .and_then(|t| {
                            let secs = u64::try_from(t.seconds).ok()?;
                            let nanos = u32::try_from(t.nanos).ok()?;
                            Some(std::time::UNIX_EPOCH + Duration::new(secs, nanos))
                        })
                        .unwrap_or_else(std::time::SystemTime::now);
                    self.exits
                        .task_exited(TaskExitEvent {
                            container_id: exit.container_id,
                            id: exit.id,
                            pid: exit.pid,
                            exit_status: exit.exit_status,
                            exited_at,
                        })
                        .await;
                }
                Err(e) => tracing::warn!(error = %e, "undecodable task exit event"),
            }
            return;
        }
        let name = match envelope.topic.as_str() {
            "/images/create" => ImageCreate::decode(event.value.as_slice()).map(|e| e.name),
            "/images/update" => ImageUpdate::decode(event.value.as_slice()).map(|e| e.name),
            "/images/delete" => ImageDelete::decode(event.value.as_slice()).map(|e| e.name),
            _ => return,
        };
        let name = match name {
            Ok(name) => name,
            Err(e) => {
                tracing::warn!(topic = %envelope.topic, error = %e, "undecodable containerd event");
                return;
            }
        };
        tracing::debug!(topic = %envelope.topic, image = %name, "image event");
        // The delete of a name crius does not hold (its own RemoveImage's, mostly) changes
        // nothing: no read of containerd while its garbage collection runs.
        if envelope.topic == "/images/delete" && !self.images.holds_reference(&name) {
            return;
        }
        if let Err(e) = sync_record(&self.containerd, &self.images, &name).await {
            tracing::warn!(image = %name, error = %e, "cannot follow image change");
        }
    }

    /// Brings the image store in line with containerd after a gap in the event stream.
    async fn resync_images(&self) {
        let records = match self.containerd.list_images().await {
            Ok(records) => records,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list images to re-sync");
                return;
            }
        };
        let present: std::collections::HashSet<String> =
            records.iter().map(|r| r.name.clone()).collect();
        for image in self.images.list() {
            for name in &image.references {
                if !present.contains(name) {
                    self.images.remove_reference(name);
                }
            }
        }
        for name in present {
            if let Err(e) = sync_record(&self.containerd, &self.images, &name).await {
                tracing::warn!(image = %name, error = %e, "cannot re-sync image");
            }
        }
    }
}
