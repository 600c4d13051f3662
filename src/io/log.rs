//! The CRI container log format: `<RFC3339Nano time> <stdout|stderr> <F|P> <content>\n`,
//! one entry per line, lines longer than the limit (16 KiB unless configured) split into `P`
//! (partial) entries and finished by an `F` (full) one. Output that ends without a newline
//! ends with a `P` entry, as containerd writes it, so kubelet knows the line is unfinished.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

/// Longest line content in one log entry by default (containerd's
/// `max_container_log_line_size`).
pub const MAX_LINE: usize = 16 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// Cuts a byte stream into log lines: complete lines (without the newline) and, for lines
/// over the limit, partial pieces.
pub struct LineSplitter {
    pending: Vec<u8>,
    max_line: usize,
}

impl Default for LineSplitter {
    fn default() -> Self {
        Self::new(MAX_LINE)
    }
}

impl LineSplitter {
    /// A splitter whose entries hold at most `max_line` bytes (at least one).
    pub fn new(max_line: usize) -> Self {
        Self {
            pending: Vec::new(),
            max_line: max_line.max(1),
        }
    }

    /// Feeds `data`; `emit(content, partial)` gets each finished entry. A line of exactly
    /// the limit is one full entry even when its newline comes in a later read (as under
    /// containerd's CRI): a full entry is held until the byte after it is seen.
    pub fn push(&mut self, mut data: &[u8], mut emit: impl FnMut(&[u8], bool)) {
        while !data.is_empty() {
            if self.pending.len() == self.max_line {
                let whole_line = data[0] == b'\n';
                emit(&self.pending, !whole_line);
                self.pending.clear();
                if whole_line {
                    data = &data[1..];
                }
                continue;
            }
            let room = self.max_line - self.pending.len();
            let window = &data[..data.len().min(room + 1)];
            match window.iter().position(|&b| b == b'\n') {
                Some(nl) => {
                    self.pending.extend_from_slice(&data[..nl]);
                    emit(&self.pending, false);
                    self.pending.clear();
                    data = &data[nl + 1..];
                }
                None => {
                    let take = data.len().min(room);
                    self.pending.extend_from_slice(&data[..take]);
                    data = &data[take..];
                }
            }
        }
    }

    /// The stream ended: a last line without newline is emitted as partial.
    pub fn finish(&mut self, mut emit: impl FnMut(&[u8], bool)) {
        if !self.pending.is_empty() {
            emit(&self.pending, true);
            self.pending.clear();
        }
    }
}

/// Formats one log entry.
pub fn format_entry(time: SystemTime, stream: Stream, partial: bool, content: &[u8]) -> Vec<u8> {
    let mut entry = Vec::with_capacity(content.len() + 48);
    EntryWriter::new(time, stream).append(&mut entry, partial, content);
    entry
}

/// Formats the entries of one stream at one time into a buffer (the timestamp once).
pub struct EntryWriter {
    prefix: String,
}

impl EntryWriter {
    pub fn new(time: SystemTime, stream: Stream) -> Self {
        Self {
            prefix: format!(
                "{} {}",
                humantime::format_rfc3339_nanos(time),
                stream.as_str()
            ),
        }
    }

    pub fn append(&self, out: &mut Vec<u8>, partial: bool, content: &[u8]) {
        out.reserve(self.prefix.len() + content.len() + 4);
        out.extend_from_slice(self.prefix.as_bytes());
        out.extend_from_slice(if partial { b" P " } else { b" F " });
        out.extend_from_slice(content);
        out.push(b'\n');
    }
}

/// A container's log file, shared by its stdout and stderr copiers; reopenable after
/// rotation.
pub struct LogFile {
    path: PathBuf,
    file: Mutex<std::fs::File>,
}

/// Opens the log for appending, creating it 0640 (kubelet and log agents read it as root or
/// through the group), never through a symlink at its path.
fn open_append(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o640)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

impl LogFile {
    pub fn open(path: &Path) -> std::io::Result<Self> {
        Ok(Self {
            path: path.to_path_buf(),
            file: Mutex::new(open_append(path)?),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes formatted entries in one write; whole entries never interleave.
    pub fn write_entries(&self, entries: &[u8]) {
        blocking(|| {
            let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
            if let Err(e) = file.write_all(entries) {
                tracing::warn!(path = %self.path.display(), error = %e, "writing container log failed");
            }
        });
    }

    /// Opens the path again (the old file was rotated away).
    pub fn reopen(&self) -> std::io::Result<()> {
        blocking(|| {
            let fresh = open_append(&self.path)?;
            *self.file.lock().unwrap_or_else(|p| p.into_inner()) = fresh;
            Ok(())
        })
    }
}

/// Runs file work that may sleep (a write throttled while the disk falls behind a
/// container's flood of output, or the lock of one) as blocking work: the async worker
/// hands its other tasks on first, so the daemon's RPCs and every other container's output
/// go on meanwhile.
fn blocking<T>(work: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(work)
        }
        _ => work(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(chunks: &[&[u8]]) -> Vec<(Vec<u8>, bool)> {
        split_at(MAX_LINE, chunks)
    }

    fn split_at(max: usize, chunks: &[&[u8]]) -> Vec<(Vec<u8>, bool)> {
        let mut out = Vec::new();
        let mut splitter = LineSplitter::new(max);
        for chunk in chunks {
            splitter.push(chunk, |c, p| out.push((c.to_vec(), p)));
        }
        splitter.finish(|c, p| out.push((c.to_vec(), p)));
        out
    }

    #[test]
    fn lines_across_chunks() {
        assert_eq!(
            split(&[b"hel", b"lo\nwor", b"ld\n\n"]),
            vec![
                (b"hello".to_vec(), false),
                (b"world".to_vec(), false),
                (b"".to_vec(), false)
            ]
        );
    }

    #[test]
    fn long_lines_are_split_into_partials_and_a_full_tail() {
        let mut line = vec![b'x'; 100 * 1024];
        line.push(b'\n');
        let entries = split(&[&line]);
        assert_eq!(entries.len(), 7);
        assert!(entries[..6].iter().all(|(c, p)| *p && c.len() == MAX_LINE));
        assert_eq!(entries[6], (vec![b'x'; 100 * 1024 - 6 * MAX_LINE], false));
        let total: usize = entries.iter().map(|(c, _)| c.len()).sum();
        assert_eq!(total, line.len() - 1);
    }

    #[test]
    fn output_ending_without_a_newline_ends_partial() {
        assert_eq!(
            split(&[b"done\nabcd"]),
            vec![(b"done".to_vec(), false), (b"abcd".to_vec(), true)]
        );
    }

    #[test]
    fn the_configured_limit_splits_lines() {
        assert_eq!(
            split_at(4, &[b"abcdefghij\n"]),
            vec![
                (b"abcd".to_vec(), true),
                (b"efgh".to_vec(), true),
                (b"ij".to_vec(), false)
            ]
        );
    }

    #[test]
    fn a_line_of_exactly_max_is_full() {
        let mut data = vec![b'y'; MAX_LINE];
        data.push(b'\n');
        assert_eq!(split(&[&data]), vec![(vec![b'y'; MAX_LINE], false)]);
    }

    #[test]
    fn a_line_of_exactly_max_is_full_when_its_newline_comes_later() {
        let line = vec![b'b'; 8];
        assert_eq!(
            split_at(8, &[&line, b"\n", b"ccccccccc\n"]),
            vec![
                (line.clone(), false),
                (b"cccccccc".to_vec(), true),
                (b"c".to_vec(), false)
            ]
        );
        // ...and a partial one when the stream ends there.
        assert_eq!(split_at(8, &[&line]), vec![(line.clone(), true)]);
        assert_eq!(
            split_at(8, &[&line, b"x\n"]),
            vec![(line, true), (b"x".to_vec(), false)]
        );
    }

    #[test]
    fn entry_format() {
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::new(1_475_713_029, 669_794_202);
        assert_eq!(
            format_entry(t, Stream::Stdout, false, b"text"),
            b"2016-10-06T00:17:09.669794202Z stdout F text\n"
        );
        assert!(format_entry(t, Stream::Stderr, true, b"x").ends_with(b"stderr P x\n"));
    }

    #[test]
    fn a_log_is_created_0640_and_never_through_a_symlink() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c/0.log");
        LogFile::open(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o640);
        let elsewhere = dir.path().join("elsewhere");
        let link = dir.path().join("c/1.log");
        std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
        assert!(LogFile::open(&link).is_err());
        assert!(!elsewhere.exists());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_log_write_that_blocks_leaves_the_worker_to_other_tasks() {
        use std::os::unix::fs::OpenOptionsExt;
        let dir = tempfile::tempdir().unwrap();
        // A FIFO stands in for a disk that does not keep up: writes past what it holds wait.
        let path = dir.path().join("slow.log");
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let reader = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .unwrap();
        let log = std::sync::Arc::new(LogFile::open(&path).unwrap());
        // The "disk" catches up after a second.
        let drain = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_secs(1));
            let mut reader = reader;
            let mut read = 0;
            let mut buf = [0u8; 65536];
            while read < 1 << 20 {
                match std::io::Read::read(&mut reader, &mut buf) {
                    Ok(n) => read += n,
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(1)),
                }
            }
            read
        });
        let started = std::time::Instant::now();
        let writer = {
            let log = log.clone();
            tokio::spawn(async move { log.write_entries(&vec![b'x'; 1 << 20]) })
        };
        // The only worker's other tasks still run while the write waits.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let ticked = started.elapsed();
        assert!(
            ticked < std::time::Duration::from_millis(900),
            "the blocked write held the worker for {ticked:?}"
        );
        writer.await.unwrap();
        assert_eq!(drain.join().unwrap(), 1 << 20);
    }

    #[test]
    fn reopen_follows_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pods/c.log");
        let log = LogFile::open(&path).unwrap();
        log.write_entries(&format_entry(
            SystemTime::now(),
            Stream::Stdout,
            false,
            b"one",
        ));
        std::fs::rename(&path, dir.path().join("rotated")).unwrap();
        log.reopen().unwrap();
        log.write_entries(&format_entry(
            SystemTime::now(),
            Stream::Stdout,
            false,
            b"two",
        ));
        let now = std::fs::read_to_string(&path).unwrap();
        assert!(now.ends_with("stdout F two\n") && !now.contains("one"));
    }
}
