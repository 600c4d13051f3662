//! Task events published to containerd's event service, in order, from one queue: exits
//! and OOMs are what crius's event monitor acts on.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use containerd_shim::asynchronous::publisher::RemotePublisher;
use containerd_shim_protos::protobuf::MessageDyn;
use tokio::sync::mpsc;

pub mod topic {
    pub const CREATE: &str = "/tasks/create";
    pub const START: &str = "/tasks/start";
    pub const EXIT: &str = "/tasks/exit";
    pub const DELETE: &str = "/tasks/delete";
    pub const EXEC_ADDED: &str = "/tasks/exec-added";
    pub const EXEC_STARTED: &str = "/tasks/exec-started";
    pub const PAUSED: &str = "/tasks/paused";
    pub const RESUMED: &str = "/tasks/resumed";
    pub const OOM: &str = "/tasks/oom";
    pub const CHECKPOINTED: &str = "/tasks/checkpointed";
}

type Event = (&'static str, Box<dyn MessageDyn>);

#[derive(Clone)]
pub struct Events {
    queue: mpsc::UnboundedSender<Event>,
    /// Events queued and not forwarded yet.
    pending: Arc<AtomicUsize>,
}

impl Events {
    /// Starts the queue that forwards to containerd's ttrpc address, connecting (again)
    /// when an event is waiting.
    pub fn start(address: String, namespace: String) -> Self {
        let (queue, mut events) = mpsc::unbounded_channel::<Event>();
        let pending = Arc::new(AtomicUsize::new(0));
        let forwarded = pending.clone();
        tokio::spawn(async move {
            let mut publisher: Option<RemotePublisher> = None;
            while let Some((topic, event)) = events.recv().await {
                if publisher.is_none() {
                    publisher = connect(&address).await;
                }
                match &publisher {
                    Some(p) => {
                        let context = containerd_shim_protos::ttrpc::context::with_timeout(0);
                        if let Err(e) = p.publish(context, topic, &namespace, event).await {
                            log::warn!("publishing {topic} failed: {e}");
                        }
                    }
                    None => log::error!("{topic} event lost: containerd is unreachable"),
                }
                forwarded.fetch_sub(1, Ordering::AcqRel);
            }
        });
        Self { queue, pending }
    }

    pub fn publish(&self, topic: &'static str, event: Box<dyn MessageDyn>) {
        self.pending.fetch_add(1, Ordering::AcqRel);
        if self.queue.send((topic, event)).is_err() {
            self.pending.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Waits (at most `limit`) until every queued event was handed to the publisher.
    pub async fn flush(&self, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        while self.pending.load(Ordering::Acquire) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Connects to containerd, retrying for a while: an event is worth waiting for.
async fn connect(address: &str) -> Option<RemotePublisher> {
    for attempt in 0..10u64 {
        match RemotePublisher::new(address).await {
            Ok(p) => return Some(p),
            Err(e) => {
                log::warn!("connecting to containerd at {address} for events: {e}");
                tokio::time::sleep(Duration::from_millis(100 * (attempt + 1))).await;
            }
        }
    }
    None
}
