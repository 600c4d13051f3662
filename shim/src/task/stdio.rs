//! A process's stdio: the FIFOs the client (crius) made, handed straight to the process when
//! it has no terminal, or copied to and from the pseudo-terminal runc sends back when it has.
//!
//! Handing the FIFOs over costs the shim no copy task and no buffer per process. The shim
//! keeps each output FIFO open read-write while the process runs, so the process never gets
//! EPIPE while the reader is away (a crius restart): output waits in the FIFO instead, as it
//! would behind the Go shim's copy. The shim's hold ends when the process exits, so the
//! reader sees EOF once the process's own copies close. Stdin is held open for writing the
//! same way, so a client that goes away (a crius restart) does not end the process's input;
//! the process sees EOF once the client closed its end and asked to close stdin (CloseIO).

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{FcntlArg, OFlag, fcntl};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::net::UnixListener;
use tokio::task::JoinHandle;

use crate::error::ShimError;
use crate::runtime::runc::ProcessStdio;

const COPY_BUFFER: usize = 32 * 1024;

/// The stdio a client asked for, as FIFO paths (empty: none).
#[derive(Debug, Clone, Default)]
pub struct StdioPaths {
    pub stdin: String,
    pub stdout: String,
    pub stderr: String,
    pub terminal: bool,
}

/// What the shim holds of a process's stdio while it runs.
#[derive(Default)]
pub struct ProcessIo {
    /// Output FIFOs held open read-write (no terminal).
    held: Vec<OwnedFd>,
    /// The stdin FIFO held open read-write until CloseIO (no terminal).
    stdin_hold: Option<OwnedFd>,
    /// The terminal's master side (terminal only), for resizes.
    console: Option<std::sync::Arc<AsyncFd<OwnedFd>>>,
    /// The copy from the stdin FIFO into the terminal.
    stdin_copy: Option<JoinHandle<()>>,
    /// The copy from the terminal to the stdout FIFO.
    output_copy: Option<tokio::task::AbortHandle>,
}

/// How long a terminal's output may keep draining after its process exited. A terminal
/// the process handed to someone else (a sibling container) never closes: its copy, the
/// terminal and the FIFO would be kept for the pod's life, one set per restart.
const TERMINAL_DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

impl Drop for ProcessIo {
    fn drop(&mut self) {
        for copy in [
            self.stdin_copy.take().map(|c| c.abort_handle()),
            self.output_copy.take(),
        ]
        .into_iter()
        .flatten()
        {
            copy.abort();
        }
    }
}

impl ProcessIo {
    pub fn resize(&self, width: u16, height: u16) -> io::Result<()> {
        let Some(console) = &self.console else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the process has no terminal",
            ));
        };
        let size = libc::winsize {
            ws_row: height,
            ws_col: width,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads one winsize from a valid pointer on a terminal fd.
        let rc = unsafe { libc::ioctl(console.get_ref().as_raw_fd(), libc::TIOCSWINSZ, &size) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Stops feeding stdin to the terminal; without one the process's stdin is the FIFO
    /// itself and ends when the client closes its end.
    pub fn close_stdin(&mut self) {
        self.stdin_hold = None;
        if let Some(copy) = self.stdin_copy.take() {
            copy.abort();
        }
    }

    /// Drops what the shim holds once the process has exited. Terminal output keeps
    /// draining until the terminal closes, for [`TERMINAL_DRAIN`] at most.
    pub fn release(&mut self) {
        self.held.clear();
        self.close_stdin();
        if let Some(copy) = self.output_copy.take() {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(async move {
                        tokio::time::sleep(TERMINAL_DRAIN).await;
                        copy.abort();
                    });
                }
                Err(_) => copy.abort(),
            }
        }
    }
}

/// Opens the FIFOs of a process without a terminal: what runc hands the process, and what
/// the shim keeps. Outputs may also be `file://` paths (appended to); `binary://` loggers
/// are not supported.
pub fn open_direct(paths: &StdioPaths) -> Result<(ProcessStdio, ProcessIo), ShimError> {
    let mut io = ProcessIo::default();
    let stdin = match Target::of(&paths.stdin)? {
        Target::None => None,
        Target::Fifo(path) => {
            let (hold, reader) = open_stdin(path).map_err(stdio_error)?;
            io.stdin_hold = Some(hold);
            Some(reader)
        }
        Target::File(_) => {
            return Err(ShimError::InvalidArgument(
                "stdin cannot be a file:// URI".into(),
            ));
        }
    };
    let mut output = |path: &str| -> Result<Option<OwnedFd>, ShimError> {
        match Target::of(path)? {
            Target::None => Ok(None),
            Target::Fifo(path) => {
                let (hold, writer) = open_output(path).map_err(stdio_error)?;
                io.held.push(hold);
                Ok(Some(writer))
            }
            Target::File(path) => open_file(path).map(Some).map_err(stdio_error),
        }
    };
    let stdout = output(&paths.stdout)?;
    let stderr = output(&paths.stderr)?;
    Ok((
        ProcessStdio {
            stdin,
            stdout,
            stderr,
        },
        io,
    ))
}

fn stdio_error(e: io::Error) -> ShimError {
    ShimError::io("stdio".into(), e)
}

/// Where a stdio path points.
#[derive(Debug, PartialEq, Eq)]
enum Target<'a> {
    None,
    Fifo(&'a Path),
    File(&'a Path),
}

impl<'a> Target<'a> {
    fn of(uri: &'a str) -> Result<Self, ShimError> {
        if uri.is_empty() {
            return Ok(Self::None);
        }
        if let Some(path) = uri.strip_prefix("file://") {
            return Ok(Self::File(Path::new(path)));
        }
        if let Some(path) = uri.strip_prefix("fifo://") {
            return Ok(Self::Fifo(Path::new(path)));
        }
        if let Some((scheme, _)) = uri.split_once("://") {
            return Err(ShimError::Unimplemented(format!(
                "{scheme}:// stdio is not supported by crius's shim"
            )));
        }
        Ok(Self::Fifo(Path::new(uri)))
    }
}

/// A `file://` output: created with its directory, appended to.
fn open_file(path: &Path) -> io::Result<OwnedFd> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    Ok(OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| with_path(e, "open output", path))?
        .into())
}

/// A stdin FIFO: a read-write hold for the shim, then a read end for the process (which
/// cannot block: the hold is a writer).
fn open_stdin(path: &Path) -> io::Result<(OwnedFd, OwnedFd)> {
    let hold = open_read_write(path, 0).map_err(|e| with_path(e, "open stdin", path))?;
    let reader: OwnedFd = OpenOptions::new()
        .read(true)
        .open(path)
        .map_err(|e| with_path(e, "open stdin", path))?
        .into();
    Ok((hold, reader))
}

fn open_read_write(path: &Path, flags: i32) -> io::Result<OwnedFd> {
    Ok(OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(flags)
        .open(path)?
        .into())
}

/// An output FIFO: a read-write hold for the shim, then a write end for the process (which
/// cannot block: the hold is a reader).
fn open_output(path: &Path) -> io::Result<(OwnedFd, OwnedFd)> {
    let hold = open_read_write(path, 0).map_err(|e| with_path(e, "open output", path))?;
    let writer: OwnedFd = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| with_path(e, "open output", path))?
        .into();
    Ok((hold, writer))
}

fn with_path(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

fn set_blocking(fd: &impl AsFd, blocking: bool) -> io::Result<()> {
    let flags = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL)?);
    let flags = if blocking {
        flags - OFlag::O_NONBLOCK
    } else {
        flags | OFlag::O_NONBLOCK
    };
    fcntl(fd, FcntlArg::F_SETFL(flags))?;
    Ok(())
}

/// The socket runc sends a new terminal's master side to, in a private directory.
pub struct ConsoleSocket {
    dir: tempfile::TempDir,
    listener: UnixListener,
}

impl ConsoleSocket {
    pub fn new() -> io::Result<Self> {
        let dir = tempfile::Builder::new().prefix("crius-pty").tempdir()?;
        let listener = UnixListener::bind(dir.path().join("pty.sock"))?;
        Ok(Self { dir, listener })
    }

    pub fn path(&self) -> PathBuf {
        self.dir.path().join("pty.sock")
    }

    /// Waits for runc to send the master side.
    pub async fn receive(self) -> io::Result<OwnedFd> {
        let (stream, _) = self.listener.accept().await?;
        loop {
            stream.readable().await?;
            match stream.try_io(Interest::READABLE, || receive_fd(stream.as_raw_fd())) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                other => return other,
            }
        }
    }
}

fn receive_fd(socket: i32) -> io::Result<OwnedFd> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    use std::os::fd::FromRawFd;
    let mut buf = [0u8; 4096];
    let mut iov = [io::IoSliceMut::new(&mut buf)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let message = recvmsg::<()>(
        socket,
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for cmsg in message.cmsgs()? {
        if let ControlMessageOwned::ScmRights(received) = cmsg {
            fds.extend(received);
        }
    }
    let mut owned: Vec<OwnedFd> = fds
        .into_iter()
        // SAFETY: SCM_RIGHTS gave this process these new descriptors.
        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
        .collect();
    if owned.len() != 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("expected one terminal fd from runc, got {}", owned.len()),
        ));
    }
    owned
        .pop()
        .ok_or_else(|| io::Error::other("no terminal fd"))
}

/// Wires a terminal to the FIFOs: output to stdout until the terminal closes, stdin into
/// the terminal until the client closes it. `on_output_done` runs when output has drained.
pub fn attach_console(master: OwnedFd, paths: &StdioPaths) -> io::Result<ProcessIo> {
    set_blocking(&master, false)?;
    let console = std::sync::Arc::new(async_fd(master)?);
    let mut output_copy = None;
    if !paths.stdout.is_empty() {
        let stdout = open_read_write(Path::new(&paths.stdout), libc::O_NONBLOCK)
            .map_err(|e| with_path(e, "open output", Path::new(&paths.stdout)))?;
        let stdout = async_fd(stdout)?;
        let from = console.clone();
        output_copy = Some(
            tokio::spawn(async move {
                if let Err(e) = copy(&from, &stdout).await {
                    log::debug!("terminal output copy ended: {e}");
                }
            })
            .abort_handle(),
        );
    }
    let stdin_copy = if paths.stdin.is_empty() {
        None
    } else {
        // Read-write, so a client that goes away is no EOF; CloseIO ends the copy.
        let stdin = open_read_write(Path::new(&paths.stdin), libc::O_NONBLOCK)
            .map_err(|e| with_path(e, "open stdin", Path::new(&paths.stdin)))?;
        let stdin = async_fd(stdin)?;
        let to = console.clone();
        Some(tokio::spawn(async move {
            if let Err(e) = copy(&stdin, &to).await {
                log::debug!("terminal input copy ended: {e}");
            }
        }))
    };
    Ok(ProcessIo {
        held: Vec::new(),
        stdin_hold: None,
        console: Some(console),
        stdin_copy,
        output_copy,
    })
}

/// Copies until EOF (or EIO: a terminal whose other side is closed).
async fn copy(from: &AsyncFd<OwnedFd>, to: &AsyncFd<OwnedFd>) -> io::Result<()> {
    let mut buf = vec![0u8; COPY_BUFFER];
    loop {
        let n = loop {
            let mut ready = from.readable().await?;
            match ready.try_io(|fd| read_fd(fd.get_ref(), &mut buf)) {
                Ok(result) => break result,
                Err(_would_block) => continue,
            }
        };
        let n = match n {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(libc::EIO) => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut written = 0;
        while written < n {
            let mut ready = to.writable().await?;
            match ready.try_io(|fd| write_fd(fd.get_ref(), &buf[written..n])) {
                Ok(result) => written += result?,
                Err(_would_block) => continue,
            }
        }
    }
}

/// Registers a descriptor with the runtime.
pub fn async_fd(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an OwnedFd stays open and the same for as long as the AsyncFd owns it.
    Ok(unsafe { AsyncFd::register(fd) }?)
}

fn read_fd(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<usize> {
    nix::unistd::read(fd, buf).map_err(io::Error::from)
}

fn write_fd(fd: &OwnedFd, buf: &[u8]) -> io::Result<usize> {
    nix::unistd::write(fd, buf).map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn output_reaches_the_reader_and_ends_when_the_process_and_hold_close() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("stdout");
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .expect("mkfifo");
        let paths = StdioPaths {
            stdout: path.display().to_string(),
            ..Default::default()
        };
        let (stdio, mut io) = open_direct(&paths).expect("open");
        // A reader that came before, like crius.
        let mut reader = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .expect("reader");
        let mut writer = std::fs::File::from(stdio.stdout.expect("stdout"));
        writer.write_all(b"hello").expect("write");
        drop(writer);
        let mut buf = [0u8; 16];
        assert_eq!(reader.read(&mut buf).expect("read"), 5);
        // The hold is a writer too: no EOF while the process could still write.
        assert_eq!(
            reader.read(&mut buf).map_err(|e| e.kind()),
            Err(io::ErrorKind::WouldBlock)
        );
        io.release();
        assert_eq!(reader.read(&mut buf).expect("eof"), 0);
    }

    #[test]
    fn stdio_uris_are_fifos_files_or_refused() {
        assert_eq!(Target::of("").ok(), Some(Target::None));
        assert_eq!(
            Target::of("/run/x/stdout").ok(),
            Some(Target::Fifo(Path::new("/run/x/stdout")))
        );
        assert_eq!(
            Target::of("file:///var/log/x").ok(),
            Some(Target::File(Path::new("/var/log/x")))
        );
        assert!(matches!(
            Target::of("binary:///usr/bin/logger?a=b"),
            Err(ShimError::Unimplemented(_))
        ));
    }

    #[test]
    fn stdin_ends_only_after_the_client_closed_and_asked_to_close_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("stdin");
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .expect("mkfifo");
        // The client's writer, as crius holds it.
        let mut client = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .expect("client");
        let paths = StdioPaths {
            stdin: path.display().to_string(),
            ..Default::default()
        };
        let (stdio, mut io) = open_direct(&paths).expect("open");
        let process = stdio.stdin.expect("stdin");
        set_blocking(&process, false).expect("nonblocking");
        let mut process = std::fs::File::from(process);
        client.write_all(b"hi").expect("write");
        drop(client);
        let mut buf = [0u8; 8];
        assert_eq!(process.read(&mut buf).expect("read"), 2);
        // The client went away: no EOF while the shim holds stdin.
        assert_eq!(
            process.read(&mut buf).map_err(|e| e.kind()),
            Err(io::ErrorKind::WouldBlock)
        );
        io.close_stdin();
        // Another test's child, forked before it execs, may hold the FIFO a moment.
        let eof = (0..100).any(|_| match process.read(&mut buf) {
            Ok(0) => true,
            _ => {
                std::thread::sleep(std::time::Duration::from_millis(10));
                false
            }
        });
        assert!(eof, "stdin ended once the shim closed it");
    }
}
