//! JSON-lines sinks: standard output, or a file rotated by size.
//!
//! The file sink writes `path`; when the next line would push it past
//! `max_bytes` it renames `path.(N-1)` to `path.N`, ..., `path` to `path.1`
//! (the oldest, `path.N` with N = `max_files`, is overwritten) and starts a
//! new `path`. A single line longer than `max_bytes` is still written, alone
//! in its file.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::config::{SinkConfig, SinkKind};
use crate::EventsError;

/// An open JSON-lines sink.
pub enum Sink {
    /// Lines go to standard output.
    Stdout(BufWriter<io::Stdout>),
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
            SinkKind::Stdout => Sink::Stdout(BufWriter::with_capacity(64 << 10, io::stdout())),
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

    /// Writes one line (a newline is appended).
    pub fn write_line(&mut self, line: &str) -> io::Result<()> {
        match self {
            Sink::None => Ok(()),
            Sink::Stdout(w) => {
                w.write_all(line.as_bytes())?;
                w.write_all(b"\n")
            }
            Sink::File(f) => f.write_line(line),
        }
    }

    /// Flushes buffered lines to the OS.
    pub fn flush(&mut self) -> io::Result<()> {
        match self {
            Sink::None => Ok(()),
            Sink::Stdout(w) => w.flush(),
            Sink::File(f) => f.flush(),
        }
    }
}

/// A file rotated by size, keeping a fixed number of old files.
pub struct RotatingFile {
    path: PathBuf,
    max_bytes: u64,
    max_files: u32,
    file: BufWriter<File>,
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
            file: BufWriter::with_capacity(64 << 10, file),
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

    fn write_line(&mut self, line: &str) -> io::Result<()> {
        let len = line.len() as u64 + 1;
        if self.size > 0 && self.size + len > self.max_bytes {
            self.rotate()?;
        }
        self.file.write_all(line.as_bytes())?;
        self.file.write_all(b"\n")?;
        self.size += len;
        Ok(())
    }

    fn rotate(&mut self) -> io::Result<()> {
        self.file.flush()?;
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
        self.file = BufWriter::with_capacity(64 << 10, file);
        self.size = 0;
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}
