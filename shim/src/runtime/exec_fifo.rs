//! runc's start, done in the shim. After `runc create` the container's init waits to open
//! the FIFO `exec.fifo` in runc's state directory for writing; all `runc start` does for
//! it is open that FIFO, read the byte the init writes just before it execs the
//! container's process, and remove the FIFO (runc tells a created container from a
//! running one by it). Doing the same here saves starting a second runc (Go) process for
//! every container and pod: 5-8 ms of each start on the development VM.
//!
//! Only what `runc start` does is done; whatever else a start may ask of runc (its
//! poststart hooks, which newer runc runs there, or a `NOTIFY_SOCKET`) the caller leaves
//! to `runc start`, and so it does when the FIFO is not where runc keeps it.

use std::fs::File;
use std::io::{ErrorKind, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// The FIFO's name in the container's runc state directory.
const EXEC_FIFO: &str = "exec.fifo";

#[derive(Debug, thiserror::Error)]
pub enum ExecFifoError {
    #[error("exec fifo {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("exec fifo {0} is not a FIFO")]
    NotAFifo(PathBuf),
    #[error("the container's init exited before it was started")]
    InitExited,
}

/// Starts the created container whose runc state directory is `state_dir` and whose init
/// is `init_pid`. `Ok(false)`: not done here (no FIFO, or the init cannot be watched), so
/// the caller runs `runc start`, which reports the container's state in its own words.
pub async fn start(state_dir: &Path, init_pid: i32) -> Result<bool, ExecFifoError> {
    let path = state_dir.join(EXEC_FIFO);
    let io = |source| ExecFifoError::Io {
        path: path.clone(),
        source,
    };
    let fifo = match open_fifo(&path) {
        Ok(fifo) => fifo,
        Err(ExecFifoError::Io { source, .. }) if source.kind() == ErrorKind::NotFound => {
            return Ok(false);
        }
        Err(e) => return Err(e),
    };
    let Ok(init) = crate::runtime::pidfd::open(init_pid) else {
        return Ok(false);
    };
    // SAFETY: the File and the OwnedFd own their descriptors, which stay open and the
    // same while the AsyncFds hold them.
    let fifo = unsafe { AsyncFd::register_with_interest(fifo, Interest::READABLE) }
        .map_err(|e| io(e.into()))?;
    // SAFETY: as above.
    let init = unsafe { AsyncFd::register_with_interest(init, Interest::READABLE) }
        .map_err(|e| io(e.into()))?;
    // The FIFO is readable once the init wrote its byte (or opened it and died); the
    // pidfd once the init exited. Either way the read tells which.
    tokio::select! {
        ready = fifo.readable() => drop(ready.map_err(io)?),
        ready = init.readable() => drop(ready.map_err(io)?),
    }
    read_start_byte(fifo.get_ref()).map_err(|e| match e {
        Some(source) => io(source),
        None => ExecFifoError::InitExited,
    })?;
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != ErrorKind::NotFound => Err(io(e)),
        _ => Ok(true),
    }
}

/// Opens the FIFO for reading without waiting for its writer (the init may have died).
fn open_fifo(path: &Path) -> Result<File, ExecFifoError> {
    let io = |source| ExecFifoError::Io {
        path: path.to_path_buf(),
        source,
    };
    let fifo = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(io)?;
    if !fifo.metadata().map_err(io)?.file_type().is_fifo() {
        return Err(ExecFifoError::NotAFifo(path.to_path_buf()));
    }
    Ok(fifo)
}

/// Reads the init's byte; `Err(None)` when there is none (the init exited first).
fn read_start_byte(mut fifo: &File) -> Result<(), Option<std::io::Error>> {
    let mut byte = [0u8; 1];
    loop {
        return match fifo.read(&mut byte) {
            Ok(1) => Ok(()),
            Ok(_) => Err(None),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => Err(None),
            Err(e) => Err(Some(e)),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::process::{Command, Stdio};

    fn mkfifo(path: &Path) {
        nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    }

    #[tokio::test]
    async fn no_fifo_leaves_the_start_to_runc() {
        let dir = tempfile::tempdir().expect("tempdir");
        let started = start(dir.path(), std::process::id() as i32).await;
        assert!(matches!(started, Ok(false)), "{started:?}");
    }

    #[tokio::test]
    async fn a_file_that_is_not_a_fifo_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(EXEC_FIFO), "0").expect("write");
        let started = start(dir.path(), std::process::id() as i32).await;
        assert!(
            matches!(started, Err(ExecFifoError::NotAFifo(_))),
            "{started:?}"
        );
    }

    #[tokio::test]
    async fn a_symlinked_fifo_is_not_followed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("elsewhere");
        mkfifo(&target);
        std::os::unix::fs::symlink(&target, dir.path().join(EXEC_FIFO)).expect("symlink");
        let started = start(dir.path(), std::process::id() as i32).await;
        assert!(
            matches!(started, Err(ExecFifoError::Io { .. })),
            "{started:?}"
        );
    }

    /// A stand-in for runc's init: a child that opens the FIFO for writing (waiting for
    /// the reader, as the init does), writes its byte and goes on; the start reads the
    /// byte and removes the FIFO.
    #[tokio::test]
    async fn the_inits_byte_starts_it_and_the_fifo_goes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(EXEC_FIFO);
        mkfifo(&path);
        let mut init = Command::new("sh")
            .arg("-c")
            .arg(format!("printf 0 > {}; exec sleep 5", path.display()))
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn");
        let started = start(dir.path(), init.id() as i32).await;
        let _ = init.kill();
        let _ = init.wait();
        assert!(matches!(started, Ok(true)), "{started:?}");
        assert!(!path.exists(), "the FIFO is removed once read");
    }

    /// An init that dies before it writes: the start fails rather than waiting forever.
    #[tokio::test]
    async fn an_init_that_exits_first_fails_the_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        mkfifo(&dir.path().join(EXEC_FIFO));
        let mut init = Command::new("sh")
            .arg("-c")
            .arg("exit 0")
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn");
        let pid = init.id() as i32;
        // Kept a zombie until the start has its pidfd, as the shim's reaper would.
        let started =
            tokio::time::timeout(std::time::Duration::from_secs(5), start(dir.path(), pid))
                .await
                .expect("the start ends when the init exits");
        let _ = init.wait();
        assert!(
            matches!(started, Err(ExecFifoError::InitExited)),
            "{started:?}"
        );
    }

    /// An init that opened the FIFO and exited without its byte fails the start too.
    #[tokio::test]
    async fn an_init_that_closes_the_fifo_without_its_byte_fails_the_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(EXEC_FIFO);
        mkfifo(&path);
        let writer_path = path.clone();
        let writer = std::thread::spawn(move || {
            // Blocks until the start opens the reading end, then closes at once.
            let mut fifo = std::fs::OpenOptions::new()
                .write(true)
                .open(writer_path)
                .expect("open for writing");
            fifo.flush().expect("flush");
        });
        let started = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            start(dir.path(), std::process::id() as i32),
        )
        .await
        .expect("the start ends when the writer closes");
        writer.join().expect("writer");
        assert!(
            matches!(started, Err(ExecFifoError::InitExited)),
            "{started:?}"
        );
    }
}
