//! JSON-lines sinks: standard output, or a file rotated by size.
//!
//! The writer serializes a whole batch into one [`Lines`] buffer and hands it
//! to [`Sink::write_batch`], which writes it with one `write` call (more only
//! when the file rotates inside the batch or the OS takes a partial write):
//! the sink costs one system call per batch, not one per record.
//!
//! The file sink writes `path`; when the next line would push it past
//! `max_bytes` it renames `path.(N-1)` to `path.N`, ..., `path` to `path.1`
//! (the oldest, `path.N` with N = `max_files`, is overwritten) and starts a
//! new `path`. A single line longer than `max_bytes` is still written, alone
//! in its file.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::aggregate::Counted;
use crate::config::{SinkConfig, SinkKind};
use crate::record::Record;
use crate::EventsError;

/// A further destination of the records: the writer thread offers it every
/// batch after the JSON-lines sink and the store have taken it (moat-sinks
/// implements Kafka, syslog and HTTP on it).
///
/// `offer` runs on the writer thread, so it must not wait on the network: an
/// implementation copies what it needs into a bounded buffer of its own,
/// drained by its own thread, and counts what does not fit.
pub trait RecordSink: Send {
    /// Takes (a copy of) the records of one batch, without blocking: `batch`,
    /// each standing for itself, and `counted`, the records of closed
    /// flood-control windows, each standing for [`Counted::count`] occurrences
    /// between its `ts` and [`Counted::last_ts`] (the JSON-lines sink and the
    /// store write the same two lists).
    fn offer(&mut self, batch: &[Record], counted: &[Counted]);
    /// The writer is stopping: the last batch has been offered. An
    /// implementation may wait here (bounded) to deliver what it holds.
    fn close(&mut self) {}
}

/// Capacity a [`Lines`] buffer keeps between batches; a larger one (after a
/// batch of unusually big records) is released so an idle writer holds little memory.
const LINES_KEEP_BYTES: usize = 4 << 20;

/// The JSON lines of one batch, back to back in one buffer, each ending with `\n`.
#[derive(Debug, Default)]
pub struct Lines {
    buf: Vec<u8>,
    /// End of each line (exclusive, after its `\n`).
    ends: Vec<usize>,
}

impl Lines {
    /// Empties the buffer for the next batch.
    pub fn clear(&mut self) {
        if self.buf.capacity() > LINES_KEEP_BYTES {
            self.buf = Vec::new();
        }
        self.buf.clear();
        self.ends.clear();
    }

    /// Empties the buffer and frees its memory (the writer is idle).
    pub fn release(&mut self) {
        self.buf = Vec::new();
        self.ends = Vec::new();
    }

    /// Serializes `value` as one line and returns its index. On error nothing is added.
    pub fn push<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<usize, serde_json::Error> {
        let start = self.buf.len();
        if let Err(e) = serde_json::to_writer(&mut self.buf, value) {
            self.buf.truncate(start);
            return Err(e);
        }
        self.buf.push(b'\n');
        self.ends.push(self.buf.len());
        Ok(self.ends.len() - 1)
    }

    /// Number of lines.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether there is no line.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Every line, newlines included.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Byte range of line `i` in [`as_bytes`](Self::as_bytes), without its newline.
    ///
    /// # Panics
    /// When `i >= self.len()`.
    pub fn span(&self, i: usize) -> Range<usize> {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        start..self.ends[i] - 1
    }
}

/// An open JSON-lines sink.
pub enum Sink {
    /// Lines go to standard output (one write per batch: a batch ends with a
    /// newline, so the standard library's line buffer passes it straight through).
    Stdout(io::Stdout),
    /// Lines go to a size-rotated file.
    File(RotatingFile),
    /// No output.
    None,
}

impl Sink {
    /// Opens the sink described by `cfg`; a relative file path is resolved against `base_dir`.
    pub fn open(cfg: &SinkConfig, base_dir: &Path) -> Result<Sink, EventsError> {
        Ok(match cfg.kind {
            SinkKind::None => Sink::None,
            SinkKind::Stdout => Sink::Stdout(io::stdout()),
            SinkKind::File => Sink::File(RotatingFile::open(
                base_dir.join(&cfg.path),
                cfg.max_bytes,
                cfg.max_files,
            )?),
        })
    }

    /// Whether lines are written at all.
    pub fn enabled(&self) -> bool {
        !matches!(self, Sink::None)
    }

    /// Writes a batch of lines and hands them to the OS (no fsync: a line
    /// written here survives the death of the process, not of the machine).
    pub fn write_batch(&mut self, lines: &Lines) -> io::Result<()> {
        match self {
            Sink::None => Ok(()),
            Sink::Stdout(out) => {
                let mut out = out.lock();
                out.write_all(lines.as_bytes())?;
                out.flush()
            }
            Sink::File(f) => f.write_batch(lines),
        }
    }
}

/// A file rotated by size, keeping a fixed number of old files.
pub struct RotatingFile {
    path: PathBuf,
    max_bytes: u64,
    max_files: u32,
    file: File,
    size: u64,
}

impl RotatingFile {
    /// Opens (appending to) `path`, creating its directory if needed.
    pub fn open(path: PathBuf, max_bytes: u64, max_files: u32) -> Result<Self, EventsError> {
        let io_err = |source| EventsError::Io {
            path: path.clone(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io_err)?;
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io_err)?;
        let size = file.metadata().map_err(io_err)?.len();
        Ok(RotatingFile {
            path,
            max_bytes,
            max_files,
            file,
            size,
        })
    }

    /// The path of the active file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Path of rotated file number `n` (1 = newest).
    pub fn rotated_path(&self, n: u32) -> PathBuf {
        let mut s = self.path.clone().into_os_string();
        s.push(format!(".{n}"));
        PathBuf::from(s)
    }

    /// Writes the lines in as few writes as rotation allows: one per file they land in.
    fn write_batch(&mut self, lines: &Lines) -> io::Result<()> {
        let bytes = lines.as_bytes();
        // Start of the bytes not written yet.
        let mut chunk = 0;
        for i in 0..lines.len() {
            let line = lines.span(i);
            let len = (line.end + 1 - line.start) as u64;
            if self.size > 0 && self.size + len > self.max_bytes {
                self.file.write_all(&bytes[chunk..line.start])?;
                chunk = line.start;
                self.rotate()?;
            }
            self.size += len;
        }
        self.file.write_all(&bytes[chunk..])
    }

    fn rotate(&mut self) -> io::Result<()> {
        if self.max_files > 0 {
            for n in (1..self.max_files).rev() {
                let from = self.rotated_path(n);
                if from.exists() {
                    std::fs::rename(&from, self.rotated_path(n + 1))?;
                }
            }
            std::fs::rename(&self.path, self.rotated_path(1))?;
        }
        let file = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&self.path)?;
        self.file = file;
        self.size = 0;
        Ok(())
    }
}
