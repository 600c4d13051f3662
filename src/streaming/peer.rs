//! The client's TCP socket, watched for a hang-up while crius is not reading from it.
//!
//! When a process does not read its stdin, a stream connection's reader waits for room and
//! stops reading the socket, so it cannot see the client go. Writing a probe to the client
//! would tell, but a SPDY ping makes kubectl answer while its own upload holds its write
//! lock, which can stall it. So the reader asks the kernel instead: a socket whose peer sent
//! FIN or RST shows `POLLRDHUP`/`POLLHUP`/`POLLERR`, whatever is still unread in it.

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

/// How often a waiting reader looks at the socket.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// The descriptor of a stream connection's TCP socket, as the HTTP server saw it; valid
/// while that connection is being served.
#[derive(Debug, Clone, Copy)]
pub struct PeerFd(pub RawFd);

/// A duplicate of a connection's socket descriptor, held by its session.
#[derive(Debug, Clone)]
pub struct PeerSocket(Arc<OwnedFd>);

impl PeerSocket {
    /// Duplicates the descriptor of the connection being served. Call it only while that
    /// connection is open (in its request handler), so the number still names it.
    pub fn of_connection(fd: PeerFd) -> Option<Self> {
        // SAFETY: the HTTP server keeps the connection's socket open while its request is
        // handled, and this runs in that handler; the descriptor is only duplicated here.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd.0) };
        borrowed
            .try_clone_to_owned()
            .ok()
            .map(|fd| Self(Arc::new(fd)))
    }

    #[cfg(test)]
    fn of(fd: BorrowedFd<'_>) -> Self {
        Self(Arc::new(
            fd.try_clone_to_owned().expect("dup a test socket"),
        ))
    }

    /// Whether the client closed its end of the connection or the connection broke.
    pub fn hung_up(&self) -> bool {
        // nix knows no POLLRDHUP (the peer's FIN) and drops events it does not know, so
        // this asks libc directly.
        let mut fds = [libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLRDHUP,
            revents: 0,
        }];
        // SAFETY: one valid pollfd for a descriptor this value owns; no waiting.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), 1, 0) };
        ready > 0 && fds[0].revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
    }

    /// Resolves once the client has hung up.
    pub async fn hang_up(&self) {
        loop {
            tokio::time::sleep(PROBE_INTERVAL).await;
            if self.hung_up() {
                return;
            }
        }
    }
}

/// Resolves when `peer` hangs up; never without one.
pub async fn hang_up(peer: Option<&PeerSocket>) {
    match peer {
        Some(peer) => peer.hang_up().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_peer_that_closes_is_seen_even_with_unread_data() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let peer = PeerSocket::of(std::os::fd::AsFd::as_fd(&server));
        client.write_all(&[0u8; 4096]).unwrap();
        assert!(!peer.hung_up(), "a live client is not gone");
        drop(client);
        std::thread::sleep(Duration::from_millis(50));
        assert!(peer.hung_up(), "a closed client is gone");
    }
}
