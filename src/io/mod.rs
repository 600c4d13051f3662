//! Container and exec stdio: FIFOs the shim writes to, copiers that turn them into the CRI
//! log and an output fan-out that attach subscribes to.
//!
//! Opening a FIFO's read end without a writer would either block or read EOF at once. So
//! each FIFO is first held open read-write by crius (a placeholder writer), the real reader
//! is opened non-blocking, and the placeholder is dropped once the task exists: from then
//! on EOF means the shim closed its end.

pub mod log;

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use nix::sys::stat::Mode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use log::{LineSplitter, LogFile, Stream};

/// How many output chunks an attach subscriber may fall behind before it loses some.
const FANOUT_CAPACITY: usize = 256;
const READ_BUFFER: usize = 32 * 1024;

/// A chunk of container output, for attach.
#[derive(Debug, Clone)]
pub struct OutputChunk {
    pub stream: Stream,
    pub data: Bytes,
}

/// The FIFO paths handed to containerd for a task or exec process.
#[derive(Debug, Clone, Default)]
pub struct FifoSet {
    pub stdin: Option<PathBuf>,
    pub stdout: Option<PathBuf>,
    pub stderr: Option<PathBuf>,
}

impl FifoSet {
    /// Creates the FIFOs under `dir`: stdin when asked, stdout always, stderr unless `tty`.
    pub fn create(dir: &Path, stdin: bool, tty: bool) -> std::io::Result<Self> {
        Self::create_for(dir, stdin, true, !tty)
    }

    /// Creates the FIFOs asked for under `dir`.
    pub fn create_for(
        dir: &Path,
        stdin: bool,
        stdout: bool,
        stderr: bool,
    ) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let make = |name: &str| -> std::io::Result<PathBuf> {
            let path = dir.join(name);
            match nix::unistd::mkfifo(&path, Mode::from_bits_truncate(0o600)) {
                Ok(()) | Err(nix::errno::Errno::EEXIST) => Ok(path),
                Err(e) => Err(std::io::Error::from(e)),
            }
        };
        Ok(Self {
            stdin: stdin.then(|| make("stdin")).transpose()?,
            stdout: stdout.then(|| make("stdout")).transpose()?,
            stderr: stderr.then(|| make("stderr")).transpose()?,
        })
    }

    /// The paths as containerd wants them (empty for none).
    pub fn paths(&self) -> [String; 3] {
        let show = |p: &Option<PathBuf>| {
            p.as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        };
        [show(&self.stdin), show(&self.stdout), show(&self.stderr)]
    }
}

/// Opens a FIFO for reading without blocking, with a placeholder writer so the reader does
/// not see EOF before the shim opens its end.
fn open_reader(path: &Path) -> std::io::Result<(pipe::Receiver, OwnedFd)> {
    let placeholder = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)?;
    let receiver = pipe::OpenOptions::new().open_receiver(path)?;
    Ok((receiver, OwnedFd::from(placeholder)))
}

/// Where a stream's bytes go.
pub trait OutputSink: Send + Sync + 'static {
    fn write(&self, stream: Stream, data: &[u8]);
    fn finish(&self, stream: Stream);
}

/// Where a client's copy of a stream goes: written in order, waiting when the client is slow.
#[async_trait::async_trait]
pub trait AsyncOutput: Send + Sync + 'static {
    async fn write(&self, data: Bytes) -> std::io::Result<()>;
}

/// Output nobody reads.
struct Discard;

#[async_trait::async_trait]
impl AsyncOutput for Discard {
    async fn write(&self, _data: Bytes) -> std::io::Result<()> {
        Ok(())
    }
}

/// Copies one FIFO to a client until EOF, or until the client is gone.
fn spawn_output_copier(mut reader: pipe::Receiver, output: Arc<dyn AsyncOutput>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut buf = bytes::BytesMut::with_capacity(READ_BUFFER);
        loop {
            buf.reserve(READ_BUFFER);
            match reader.read_buf(&mut buf).await {
                Ok(0) => break,
                Ok(_) => {
                    if let Err(e) = output.write(buf.split().freeze()).await {
                        tracing::debug!(error = %e, "client output closed");
                        break;
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "output copier stopped");
                    break;
                }
            }
        }
    })
}

thread_local! {
    /// The read buffer of the FIFO copiers that run on this thread: a copier holds none
    /// while it waits, so an idle container costs no buffer.
    static COPY_BUFFER: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0; READ_BUFFER]);
}

/// What one read of a FIFO came to.
enum Copied {
    Some,
    Eof,
    Failed(std::io::Error),
}

/// Copies one FIFO into a sink until EOF.
fn spawn_copier(
    reader: pipe::Receiver,
    stream: Stream,
    sink: Arc<dyn OutputSink>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let copied = match reader.readable().await {
                Ok(()) => COPY_BUFFER.with_borrow_mut(|buf| match reader.try_read(buf) {
                    Ok(0) => Copied::Eof,
                    Ok(n) => {
                        sink.write(stream, &buf[..n]);
                        Copied::Some
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Copied::Some,
                    Err(e) => Copied::Failed(e),
                }),
                Err(e) => Copied::Failed(e),
            };
            match copied {
                Copied::Some => {}
                Copied::Eof => break,
                Copied::Failed(e) => {
                    tracing::debug!(stream = stream.as_str(), error = %e, "output copier stopped");
                    break;
                }
            }
        }
        sink.finish(stream);
    })
}

/// Turns output into log entries and attach chunks.
struct LogSink {
    log: Mutex<Option<Arc<LogFile>>>,
    splitters: Mutex<[LineSplitter; 2]>,
    /// Made on the first attach: most containers never have one.
    fanout: std::sync::OnceLock<broadcast::Sender<OutputChunk>>,
}

impl LogSink {
    /// Runs `f` on the stream's splitter and writes the entries it emits to the log, all
    /// in one write.
    fn with_splitter(
        &self,
        stream: Stream,
        f: impl FnOnce(&mut LineSplitter, &mut dyn FnMut(&[u8], bool)),
    ) {
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut entries = Vec::new();
        let writer = log::EntryWriter::new(std::time::SystemTime::now(), stream);
        let mut emit = |content: &[u8], partial: bool| {
            if log.is_some() {
                writer.append(&mut entries, partial, content);
            }
        };
        {
            let mut splitters = self.splitters.lock().unwrap_or_else(|p| p.into_inner());
            let index = match stream {
                Stream::Stdout => 0,
                Stream::Stderr => 1,
            };
            f(&mut splitters[index], &mut emit);
        }
        if let Some(log) = log
            && !entries.is_empty()
        {
            log.write_entries(&entries);
        }
    }
}

impl OutputSink for LogSink {
    fn write(&self, stream: Stream, data: &[u8]) {
        self.with_splitter(stream, |splitter, emit| splitter.push(data, emit));
        // Nobody attached is the normal case: then no copy is made.
        let Some(fanout) = self.fanout.get().filter(|f| f.receiver_count() > 0) else {
            return;
        };
        let _ = fanout.send(OutputChunk {
            stream,
            data: Bytes::copy_from_slice(data),
        });
    }

    fn finish(&self, stream: Stream) {
        self.with_splitter(stream, |splitter, emit| splitter.finish(emit));
    }
}

/// A container's stdio: FIFOs, the log copiers and the attach fan-out.
pub struct ContainerIo {
    dir: PathBuf,
    fifos: FifoSet,
    sink: Arc<LogSink>,
    copiers: Mutex<Vec<JoinHandle<()>>>,
    placeholders: Mutex<Vec<OwnedFd>>,
    /// The stdin writer while stdin is open.
    stdin: tokio::sync::Mutex<Option<pipe::Sender>>,
    /// Cancelled when stdin closes: a write blocked on a full pipe (a process that does not
    /// read its stdin) gives way, so closing stdin never waits for one.
    stdin_closed: CancellationToken,
}

impl ContainerIo {
    /// Creates the FIFOs in `dir`. Nothing is copied until [`ContainerIo::start`].
    pub fn create(dir: &Path, stdin: bool, tty: bool) -> std::io::Result<Self> {
        let fifos = FifoSet::create(dir, stdin, tty)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            fifos,
            sink: Arc::new(LogSink {
                log: Mutex::new(None),
                splitters: Mutex::new(Default::default()),
                fanout: std::sync::OnceLock::new(),
            }),
            copiers: Mutex::new(Vec::new()),
            placeholders: Mutex::new(Vec::new()),
            stdin: tokio::sync::Mutex::new(None),
            stdin_closed: CancellationToken::new(),
        })
    }

    pub fn fifos(&self) -> &FifoSet {
        &self.fifos
    }

    /// Opens the log (when there is one) and starts copying, lines of at most `max_line`
    /// bytes per entry; call before the task is created, then
    /// [`ContainerIo::task_created`] once it is.
    pub fn start(&self, log_path: Option<&Path>, max_line: usize) -> std::io::Result<()> {
        *self
            .sink
            .splitters
            .lock()
            .unwrap_or_else(|p| p.into_inner()) =
            [LineSplitter::new(max_line), LineSplitter::new(max_line)];
        if let Some(path) = log_path {
            *self.sink.log.lock().unwrap_or_else(|p| p.into_inner()) =
                Some(Arc::new(LogFile::open(path)?));
        }
        let mut copiers = self.copiers.lock().unwrap_or_else(|p| p.into_inner());
        let mut placeholders = self.placeholders.lock().unwrap_or_else(|p| p.into_inner());
        for (path, stream) in [
            (&self.fifos.stdout, Stream::Stdout),
            (&self.fifos.stderr, Stream::Stderr),
        ] {
            if let Some(path) = path {
                let (reader, placeholder) = open_reader(path)?;
                placeholders.push(placeholder);
                copiers.push(spawn_copier(reader, stream, self.sink.clone()));
            }
        }
        if let Some(path) = &self.fifos.stdin {
            let sender = pipe::OpenOptions::new()
                .read_write(true)
                .open_sender(path)?;
            *self.stdin.try_lock().map_err(std::io::Error::other)? = Some(sender);
        }
        Ok(())
    }

    /// The shim has its ends open (or never will): EOF now means the writer is gone.
    pub fn task_created(&self) {
        self.placeholders
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// Waits for the copiers to reach EOF, at most `limit`; stops them after that (a
    /// background process may hold the output open forever). Partial lines are flushed.
    pub async fn drain(&self, limit: Duration) {
        self.task_created();
        let copiers: Vec<JoinHandle<()>> =
            std::mem::take(&mut *self.copiers.lock().unwrap_or_else(|p| p.into_inner()));
        let deadline = tokio::time::Instant::now() + limit;
        for copier in copiers {
            let abort = copier.abort_handle();
            if tokio::time::timeout_at(deadline, copier).await.is_err() {
                abort.abort();
            }
        }
        for stream in [Stream::Stdout, Stream::Stderr] {
            self.sink.finish(stream);
        }
        self.close_stdin().await;
    }

    /// Reopens the log file after rotation.
    pub fn reopen_log(&self) -> std::io::Result<()> {
        match self
            .sink
            .log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            Some(log) => log.reopen(),
            None => Ok(()),
        }
    }

    /// Output from now on, for attach.
    pub fn subscribe(&self) -> broadcast::Receiver<OutputChunk> {
        self.sink
            .fanout
            .get_or_init(|| broadcast::channel(FANOUT_CAPACITY).0)
            .subscribe()
    }

    /// Writes an attached client's input to the container's stdin: `Ok(false)` once stdin
    /// is closed (or was never asked for). A write the process does not read ends when stdin
    /// closes.
    pub async fn write_stdin(&self, data: &[u8]) -> std::io::Result<bool> {
        let closed = &self.stdin_closed;
        let mut stdin = tokio::select! {
            biased;
            () = closed.cancelled() => return Ok(false),
            stdin = self.stdin.lock() => stdin,
        };
        let Some(fifo) = stdin.as_mut() else {
            return Ok(false);
        };
        tokio::select! {
            biased;
            () = closed.cancelled() => Ok(false),
            written = fifo.write_all(data) => written.map(|()| true),
        }
    }

    pub async fn close_stdin(&self) {
        self.stdin_closed.cancel();
        self.stdin.lock().await.take();
    }

    /// Removes the FIFOs' directory.
    pub fn remove(&self) {
        self.task_created();
        if let Err(e) = std::fs::remove_dir_all(&self.dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %self.dir.display(), error = %e, "removing FIFOs failed");
        }
    }
}

/// Collects an exec process's output in memory, up to a limit per stream.
pub struct CapturedOutput {
    limit: usize,
    buffers: Mutex<[Vec<u8>; 2]>,
}

impl CapturedOutput {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit,
            buffers: Mutex::new(Default::default()),
        })
    }

    pub fn take(&self) -> (Vec<u8>, Vec<u8>) {
        let mut buffers = self.buffers.lock().unwrap_or_else(|p| p.into_inner());
        (
            std::mem::take(&mut buffers[0]),
            std::mem::take(&mut buffers[1]),
        )
    }
}

impl OutputSink for CapturedOutput {
    fn write(&self, stream: Stream, data: &[u8]) {
        let mut buffers = self.buffers.lock().unwrap_or_else(|p| p.into_inner());
        let buffer = match stream {
            Stream::Stdout => &mut buffers[0],
            Stream::Stderr => &mut buffers[1],
        };
        let room = self.limit.saturating_sub(buffer.len());
        buffer.extend_from_slice(&data[..data.len().min(room)]);
    }

    fn finish(&self, _stream: Stream) {}
}

/// The stdio of one exec process: FIFOs and copiers into a sink or to a client.
pub struct ExecIo {
    dir: PathBuf,
    fifos: FifoSet,
    copiers: Vec<JoinHandle<()>>,
    placeholders: Vec<OwnedFd>,
    stdin: Option<pipe::Sender>,
}

impl ExecIo {
    /// Creates stdout/stderr FIFOs in `dir` and starts copying them into `sink`.
    pub fn start(dir: &Path, sink: Arc<dyn OutputSink>) -> std::io::Result<Self> {
        let fifos = FifoSet::create(dir, false, false)?;
        let mut copiers = Vec::new();
        let mut placeholders = Vec::new();
        for (path, stream) in [
            (&fifos.stdout, Stream::Stdout),
            (&fifos.stderr, Stream::Stderr),
        ] {
            if let Some(path) = path {
                let (reader, placeholder) = open_reader(path)?;
                placeholders.push(placeholder);
                copiers.push(spawn_copier(reader, stream, sink.clone()));
            }
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            fifos,
            copiers,
            placeholders,
            stdin: None,
        })
    }

    /// Creates the FIFOs of a streaming exec in `dir` and starts copying output to the
    /// client; output nobody asked for is read and dropped (the shim needs a FIFO for
    /// stderr unless `tty`). With `stdin`, [`ExecIo::take_stdin`] gives the writer.
    pub fn start_streams(
        dir: &Path,
        stdin: bool,
        tty: bool,
        stdout: Option<Arc<dyn AsyncOutput>>,
        stderr: Option<Arc<dyn AsyncOutput>>,
    ) -> std::io::Result<Self> {
        let fifos = FifoSet::create(dir, stdin, tty)?;
        let discard = || Arc::new(Discard) as Arc<dyn AsyncOutput>;
        let stdout = Some(stdout.unwrap_or_else(discard));
        let stderr = Some(stderr.unwrap_or_else(discard));
        let mut io = Self {
            dir: dir.to_path_buf(),
            fifos: fifos.clone(),
            copiers: Vec::new(),
            placeholders: Vec::new(),
            stdin: None,
        };
        for (path, output) in [(&fifos.stdout, stdout), (&fifos.stderr, stderr)] {
            if let (Some(path), Some(output)) = (path, output) {
                let (reader, placeholder) = open_reader(path)?;
                io.placeholders.push(placeholder);
                io.copiers.push(spawn_output_copier(reader, output));
            }
        }
        if let Some(path) = &fifos.stdin {
            // Read-write, so opening does not wait for the shim; dropping it is the EOF.
            io.stdin = Some(
                pipe::OpenOptions::new()
                    .read_write(true)
                    .open_sender(path)?,
            );
        }
        Ok(io)
    }

    /// The stdin writer, once.
    pub fn take_stdin(&mut self) -> Option<pipe::Sender> {
        self.stdin.take()
    }

    pub fn fifos(&self) -> &FifoSet {
        &self.fifos
    }

    /// The process exists: EOF now means it (and its children) closed the output.
    pub fn process_created(&mut self) {
        self.placeholders.clear();
    }

    /// Waits for EOF on both streams, at most `limit`, then stops copying and removes the
    /// FIFOs. True when both streams ended in time.
    pub async fn finish(mut self, limit: Duration) -> bool {
        self.placeholders.clear();
        let deadline = tokio::time::Instant::now()
            .checked_add(limit)
            .unwrap_or_else(far_future);
        let mut drained = true;
        for copier in self.copiers.drain(..) {
            let abort = copier.abort_handle();
            if tokio::time::timeout_at(deadline, copier).await.is_err() {
                abort.abort();
                drained = false;
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        drained
    }
}

/// A day from now: "no limit" for a wait that still needs an instant.
fn far_future() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(24 * 60 * 60)
}

impl Drop for ExecIo {
    fn drop(&mut self) {
        for copier in &self.copiers {
            copier.abort();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[tokio::test]
    async fn copies_fifo_output_into_the_cri_log_and_the_fanout() {
        let dir = tempfile::tempdir().unwrap();
        let io = ContainerIo::create(&dir.path().join("io"), false, false).unwrap();
        let log_path = dir.path().join("logs/c.log");
        io.start(Some(&log_path), log::MAX_LINE).unwrap();
        let mut attached = io.subscribe();
        // Stand in for the shim: open the write ends, write, close.
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .open(io.fifos().stdout.as_ref().unwrap())
            .unwrap();
        let mut err = std::fs::OpenOptions::new()
            .write(true)
            .open(io.fifos().stderr.as_ref().unwrap())
            .unwrap();
        io.task_created();
        out.write_all(b"out\npartial").unwrap();
        err.write_all(b"err\n").unwrap();
        drop(out);
        drop(err);
        io.drain(Duration::from_secs(5)).await;
        let log = std::fs::read_to_string(&log_path).unwrap();
        assert!(log.contains(" stdout F out\n"), "{log}");
        // Unfinished by a newline: partial, as containerd writes it.
        assert!(log.contains(" stdout P partial\n"), "{log}");
        assert!(log.contains(" stderr F err\n"), "{log}");
        let chunk = attached.recv().await.unwrap();
        assert!(!chunk.data.is_empty());
        io.remove();
        assert!(!dir.path().join("io").exists());
    }

    #[tokio::test]
    async fn closing_stdin_does_not_wait_for_a_write_nobody_reads() {
        let dir = tempfile::tempdir().unwrap();
        let io = Arc::new(ContainerIo::create(&dir.path().join("io"), true, false).unwrap());
        io.start(None, log::MAX_LINE).unwrap();
        // More than a pipe holds, into a stdin no process reads.
        let writer = {
            let io = io.clone();
            tokio::spawn(async move { io.write_stdin(&vec![b'x'; 1 << 20]).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!writer.is_finished(), "the pipe took a whole MiB");
        tokio::time::timeout(Duration::from_secs(5), io.close_stdin())
            .await
            .expect("closing stdin waited for the blocked write");
        let written = writer.await.unwrap().unwrap();
        assert!(!written, "the cut-off write reported success");
        assert!(!io.write_stdin(b"more").await.unwrap(), "stdin is closed");
    }

    #[tokio::test]
    async fn drain_gives_up_on_a_writer_that_never_closes() {
        let dir = tempfile::tempdir().unwrap();
        let io = ContainerIo::create(&dir.path().join("io"), false, true).unwrap();
        io.start(None, log::MAX_LINE).unwrap();
        let _held = std::fs::OpenOptions::new()
            .write(true)
            .open(io.fifos().stdout.as_ref().unwrap())
            .unwrap();
        let started = std::time::Instant::now();
        io.drain(Duration::from_millis(200)).await;
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}
