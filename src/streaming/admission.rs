//! Who holds the stream server's places. A connection is *pending* from accept until it
//! presents a stream request with a valid token, then *admitted*. A full server closes the
//! oldest pending connections to make room for a new one: idle or slow connections cost
//! whoever opened them, never kubelet's next exec or a session already open.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

/// The places of the stream server's connections.
#[derive(Default)]
pub struct Admission {
    next: AtomicU64,
    /// Pending connections by accept order, each with the token that closes it.
    pending: Mutex<BTreeMap<u64, CancellationToken>>,
    /// Connections admitted and not yet ended (their sessions are counted apart).
    admitted: AtomicUsize,
}

impl Admission {
    /// A place for a newly accepted connection, pending.
    pub fn ticket(self: &Arc<Self>) -> Ticket {
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        let evict = CancellationToken::new();
        self.lock().insert(seq, evict.clone());
        Ticket {
            seq,
            evict,
            admitted: AtomicBool::new(false),
            admission: self.clone(),
        }
    }

    /// Connections pending or admitted (what the server holds but its sessions).
    pub fn occupied(&self) -> usize {
        self.lock().len() + self.admitted.load(Ordering::Relaxed)
    }

    /// Closes the oldest pending connection; false when none is pending.
    pub fn evict_oldest(&self) -> bool {
        let oldest = self.lock().pop_first();
        match oldest {
            Some((_, evict)) => {
                evict.cancel();
                true
            }
            None => false,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, CancellationToken>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One connection's place; given back when dropped.
pub struct Ticket {
    seq: u64,
    evict: CancellationToken,
    admitted: AtomicBool,
    admission: Arc<Admission>,
}

impl Ticket {
    /// Takes the connection out of those a full server may close, when it presents a valid
    /// request: false when it was closed to make room already.
    pub fn admit(&self) -> bool {
        if self.admitted.load(Ordering::Acquire) {
            return true;
        }
        if self.admission.lock().remove(&self.seq).is_none() {
            return false;
        }
        self.admission.admitted.fetch_add(1, Ordering::Relaxed);
        self.admitted.store(true, Ordering::Release);
        true
    }

    pub fn is_admitted(&self) -> bool {
        self.admitted.load(Ordering::Acquire)
    }

    /// Resolves when a full server closes this connection to make room.
    pub fn evicted(&self) -> WaitForCancellationFuture<'_> {
        self.evict.cancelled()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.is_admitted() {
            self.admission.admitted.fetch_sub(1, Ordering::Relaxed);
        } else {
            self.admission.lock().remove(&self.seq);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_pending_connection_goes_first_and_admitted_ones_never() {
        let admission = Arc::new(Admission::default());
        let first = admission.ticket();
        let second = admission.ticket();
        let third = admission.ticket();
        assert_eq!(admission.occupied(), 3);
        assert!(first.admit(), "a pending connection is admitted");
        assert!(first.admit(), "admitting twice is harmless");
        assert_eq!(admission.occupied(), 3);

        // The oldest pending is the second: the admitted first stays.
        assert!(admission.evict_oldest());
        assert!(second.evict.is_cancelled());
        assert!(!first.evict.is_cancelled() && !third.evict.is_cancelled());
        assert!(!second.admit(), "an evicted connection cannot be admitted");
        assert_eq!(admission.occupied(), 2);

        assert!(admission.evict_oldest());
        assert!(third.evict.is_cancelled());
        assert!(
            !admission.evict_oldest(),
            "only admitted connections are left"
        );

        drop((second, third));
        assert_eq!(admission.occupied(), 1);
        drop(first);
        assert_eq!(admission.occupied(), 0);
    }

    #[test]
    fn a_pending_connection_that_ends_gives_its_place_back() {
        let admission = Arc::new(Admission::default());
        let ticket = admission.ticket();
        assert_eq!(admission.occupied(), 1);
        drop(ticket);
        assert_eq!(admission.occupied(), 0);
        assert!(!admission.evict_oldest());
    }
}
