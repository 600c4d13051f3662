//! Task events published to containerd's event service, in order, from one queue: exits
//! and OOMs are what crius's event monitor acts on.

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
}

impl Events {
    /// Starts the queue that forwards to containerd's ttrpc address, connecting (again)
    /// when an event is waiting.
    pub fn start(address: String, namespace: String) -> Self {
        let (queue, mut events) = mpsc::unbounded_channel::<Event>();
        tokio::spawn(async move {
            let mut publisher: Option<RemotePublisher> = None;
            while let Some((topic, event)) = events.recv().await {
                let publisher = match &publisher {
                    Some(p) => p,
                    None => match connect(&address).await {
                        Some(p) => publisher.insert(p),
                        None => continue,
                    },
                };
                let context = containerd_shim_protos::ttrpc::context::with_timeout(0);
                if let Err(e) = publisher.publish(context, topic, &namespace, event).await {
                    log::warn!("publishing {topic} failed: {e}");
                }
            }
        });
        Self { queue }
    }

    pub fn publish(&self, topic: &'static str, event: Box<dyn MessageDyn>) {
        let _ = self.queue.send((topic, event));
    }
}

/// Connects to containerd, retrying for a while: an event is worth waiting for.
async fn connect(address: &str) -> Option<RemotePublisher> {
    for attempt in 0..10u64 {
        match RemotePublisher::new(address).await {
            Ok(p) => return Some(p),
            Err(e) => {
                log::warn!("connecting to containerd at {address} for events: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100 * (attempt + 1))).await;
            }
        }
    }
    None
}
