//! Unix socket set-up for the CRI endpoints: refuse a live server, replace a stale file,
//! restrict the mode.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

/// The socket mode: owner and group may connect (kubelet runs as root, operators use a group).
const SOCKET_MODE: u32 = 0o660;

#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("another server is already listening on {0}; refusing to start")]
    InUse(PathBuf),
    #[error("failed to {op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> SocketError + use<> {
    let path = path.to_path_buf();
    move |source| SocketError::Io { op, path, source }
}

/// Binds a listener at `path`: a live server there is an error, a stale socket file is
/// removed, the parent directory is created, and the socket gets mode 0660.
pub async fn bind(path: &Path) -> Result<UnixListener, SocketError> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) => {
            if tokio::net::UnixStream::connect(path).await.is_ok() {
                return Err(SocketError::InUse(path.to_path_buf()));
            }
            // Only a socket is stale; anything else at the path is someone's file.
            if !std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()) {
                return Err(io_err("replace a non-socket at", path)(
                    std::io::Error::new(
                        std::io::ErrorKind::AlreadyExists,
                        "the path holds a file that is not a socket",
                    ),
                ));
            }
            tracing::info!(path = %path.display(), "removing stale socket");
            std::fs::remove_file(path).map_err(io_err("remove stale socket", path))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("inspect", path)(e)),
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io_err("create directory for", path))?;
    }
    let listener = UnixListener::bind(path).map_err(io_err("listen on", path))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE))
        .map_err(io_err("set permissions of", path))?;
    Ok(listener)
}

/// Removes a socket file this process created; a missing file is fine.
pub fn remove(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(path = %path.display(), error = %e, "failed to remove socket"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn replaces_stale_socket_and_refuses_live_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/crius.sock");
        let first = bind(&path).await.unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, SOCKET_MODE);
        // Live: the listener accepts connections.
        assert!(matches!(bind(&path).await, Err(SocketError::InUse(_))));
        drop(first);
        // Stale: the file remains but nobody listens.
        assert!(path.exists());
        let _second = bind(&path).await.unwrap();
        remove(&path);
        assert!(!path.exists());
        remove(&path);
        // Someone's file at the path is not a stale socket: it stays.
        std::fs::write(&path, b"keep").unwrap();
        assert!(bind(&path).await.is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"keep");
    }
}
