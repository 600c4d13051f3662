//! `GetContainerEvents`: every subscriber sees containers (and sandboxes, whose events carry
//! the sandbox ID) being created, started, stopped and deleted, each event with the pod's
//! status and its containers' statuses, as the CRI defines. Events go through a bounded
//! broadcast: a subscriber that falls behind loses the oldest events (logged) and never
//! slows the service down. The broadcast holds each event once, behind an `Arc`: its slots
//! are allocated up front, and at the size of an event they cost half a megabyte.

use std::sync::Arc;

use crate::api::v1::{ContainerEventResponse, ContainerEventType, GetEventsRequest};
use futures::StreamExt;
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tonic::Status;

use super::sandbox_status::sandbox_cri_status;
use super::unix_nanos;
use crate::cri::CriService;

/// The stream type of `GetContainerEvents`.
pub type ContainerEventStream = std::pin::Pin<
    Box<dyn futures::Stream<Item = Result<ContainerEventResponse, Status>> + Send + 'static>,
>;

/// Events a subscriber may fall behind by before it loses some.
pub const EVENT_BUFFER: usize = 1024;

impl CriService {
    pub async fn get_container_events(
        &self,
        _req: GetEventsRequest,
    ) -> Result<ContainerEventStream, Status> {
        let events = BroadcastStream::new(self.container_events.subscribe())
            .filter_map(|event| async move {
                match event {
                    Ok(event) => Some(Ok(Arc::unwrap_or_clone(event))),
                    Err(BroadcastStreamRecvError::Lagged(missed)) => {
                        crate::metrics::metrics().events_dropped(missed);
                        tracing::warn!(
                            missed,
                            "a container event subscriber fell behind; events dropped"
                        );
                        None
                    }
                }
            })
            // The stream ends with the service, so shutdown does not wait for subscribers.
            .take_until(self.shutdown.clone().cancelled_owned());
        Ok(Box::pin(events))
    }

    /// Tells subscribers about `id` (a container, or the sandbox itself) of `sandbox_id`.
    pub(crate) fn emit_container_event(
        &self,
        id: &str,
        sandbox_id: &str,
        kind: ContainerEventType,
    ) {
        if self.container_events.receiver_count() == 0 {
            return;
        }
        let pod_sandbox_status = self
            .sandboxes
            .get(sandbox_id)
            .ok()
            .flatten()
            .map(|sandbox| sandbox_cri_status(&sandbox));
        let containers_statuses = self
            .containers
            .in_sandbox(sandbox_id)
            .iter()
            .map(|container| self.container_cri_status(container))
            .collect();
        // No subscriber left since the check is fine.
        let _ = self.container_events.send(Arc::new(ContainerEventResponse {
            container_id: id.to_string(),
            container_event_type: kind as i32,
            created_at: unix_nanos(std::time::SystemTime::now()),
            pod_sandbox_status,
            containers_statuses,
        }));
    }
}
