//! Reserving a sandbox's or container's name, with kubelet's retries in mind: a retry of the
//! same request whose first call's answer did not reach its client (it gave up first, or
//! crius restarted) joins the first call (it waits for it and gets its ID) rather than
//! failing with "name is reserved"; a different request under a taken name, or the same
//! request again after the first was answered, gets ALREADY_EXISTS, as under containerd.

use tonic::Status;

use crate::store::NameRegistrar;

/// What reserving a name found.
pub(crate) enum Reservation {
    /// The name is ours: go on and make the object.
    New,
    /// The same request made the object already: this is its ID.
    Existing(String),
}

/// Whether the client of the call in progress is still waiting for its answer (its deadline,
/// if it set one, has not passed).
pub(crate) fn client_still_waiting() -> bool {
    crate::cri::deadline::current().is_none_or(|at| tokio::time::Instant::now() < at)
}

/// Reserves `name` for `id`, made by the request with `fingerprint`. `exists` tells whether
/// an object with a given ID is there (made, not failed).
pub(crate) async fn reserve(
    names: &NameRegistrar,
    kind: &str,
    name: &str,
    id: &str,
    fingerprint: &str,
    exists: impl Fn(&str) -> bool,
) -> Result<Reservation, Status> {
    loop {
        let conflict = match names.reserve_for(name, id, Some(fingerprint)) {
            Ok(()) => return Ok(Reservation::New),
            Err(conflict) => conflict,
        };
        let refused = Status::already_exists(format!(
            "failed to reserve {kind} name {name:?}: it is taken by {} (made by a different \
             request)",
            conflict.holder
        ));
        if !conflict.same_request {
            return Err(refused);
        }
        let holder = conflict.holder.clone();
        tracing::info!(
            kind,
            name,
            holder,
            "a retry of the same request: waiting for the first"
        );
        conflict.wait_settled().await;
        if exists(&holder) {
            return Ok(Reservation::Existing(holder));
        }
        if names.holder(name).as_deref() == Some(holder.as_str()) {
            // Settled, still holding the name, yet gone: being removed. Not ours to take.
            return Err(refused);
        }
        // The first call failed and gave the name up: this one makes the object.
    }
}
