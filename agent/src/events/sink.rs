//! Where decoded events go: JSON lines to a writer (stdout, or a file rotated by size so that a
//! long-running agent under attack cannot fill the disk), and the other sinks beside it.

use std::{
    collections::HashSet,
    ffi::CString,
    fs::{File, OpenOptions},
    io::{self, Write},
    os::{
        fd::AsRawFd,
        unix::{ffi::OsStrExt, fs::OpenOptionsExt},
    },
    path::{Path, PathBuf},
};

use palisade_common::InodeKey;
use tracing::{info, warn};

use super::{AuditEvent, ModuleFailure};
use crate::bpf::{ProtectError, ProtectedFiles, Protection};

/// A destination of audit events. `send` never blocks the loop that reads the kernel's events.
pub trait Sink: Send {
    /// Takes an event, to write now or at the end of the batch (`flush`).
    fn send(&mut self, event: &AuditEvent);
    /// A rule module's failure, reported beside the events.
    fn report(&mut self, failure: &ModuleFailure);
    /// The batch is over: writes what `send` and `report` kept.
    fn flush(&mut self) {}
    /// Events this sink has lost so far (failed writes, a full queue).
    fn lost(&self) -> u64;
    /// What the sink is, for reports.
    fn name(&self) -> &str;
}

/// One JSON object per line, a batch of lines per write. A batch that cannot be written (a full
/// or read-only file system) is lost, counted; each new kind of failure, and the recovery, is
/// logged.
pub struct JsonLines {
    name: String,
    writer: Box<dyn Write + Send>,
    /// The lines of the batch, not yet written.
    batch: Vec<u8>,
    lines: u64,
    failed: u64,
    /// Lines lost since writing last worked, and the last failure, if it does not work now.
    failing: Option<(u64, io::ErrorKind)>,
}

impl JsonLines {
    pub fn new(name: impl Into<String>, writer: Box<dyn Write + Send>) -> Self {
        Self {
            name: name.into(),
            writer,
            batch: Vec::new(),
            lines: 0,
            failed: 0,
            failing: None,
        }
    }

    fn end_line(&mut self) {
        self.batch.push(b'\n');
        self.lines += 1;
    }
}

impl Sink for JsonLines {
    fn send(&mut self, event: &AuditEvent) {
        event.write_json(&mut self.batch);
        self.end_line();
    }

    fn report(&mut self, failure: &ModuleFailure) {
        serde_json::to_writer(&mut self.batch, failure).expect("failures serialize");
        self.end_line();
    }

    fn flush(&mut self) {
        // Nothing to write says nothing about whether writing works.
        if self.batch.is_empty() {
            return;
        }
        let written = self
            .writer
            .write_all(&self.batch)
            .and_then(|()| self.writer.flush());
        match written {
            Ok(()) => {
                if let Some((lost, _)) = self.failing.take() {
                    info!(sink = %self.name, lost, "writing audit events again");
                }
            }
            Err(err) => {
                if self.failing.is_none_or(|(_, kind)| kind != err.kind()) {
                    warn!(
                        sink = %self.name,
                        "cannot write audit events, counting them lost \
                         (palisade_events_lost_total) until it can: {err}"
                    );
                }
                let lost = self.failing.map_or(0, |(lost, _)| lost) + self.lines;
                self.failing = Some((lost, err.kind()));
                self.failed += self.lines;
            }
        }
        self.batch.clear();
        self.lines = 0;
    }

    fn lost(&self) -> u64 {
        self.failed
    }

    fn name(&self) -> &str {
        &self.name
    }
}

/// Size-based rotation: when a line would take the file past `max_bytes`, FILE becomes FILE.1,
/// FILE.1 becomes FILE.2, and so on; `keep` rotated files are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rotation {
    pub max_bytes: u64,
    pub keep: u32,
}

impl Rotation {
    /// One file, growing.
    pub const NEVER: Rotation = Rotation {
        max_bytes: u64::MAX,
        keep: 0,
    };
}

/// The audit trail: a file of JSON lines, rotated by size. With the agent enforcing, targets may
/// neither read nor change any of its files (the one written and those rotated): each is
/// protected before it has a name, and released once it is gone. A write that fails leaves no
/// part of its batch behind, and the file is closed: the next batch opens it again, so that
/// writing resumes once the file system has room, or is writable, again.
pub struct RotatingFile {
    path: PathBuf,
    rotation: Rotation,
    /// None after a write failed.
    file: Option<File>,
    size: u64,
    /// The size when the last batch was written whole (`flush`).
    committed: u64,
    protected: Option<ProtectedFiles>,
    /// The inodes of the files protected.
    kept: HashSet<InodeKey>,
}

fn append(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

/// Opens `path` to append to, creating it if need be. A file it creates is protected by
/// `protected` before it has a name (made unnamed in the directory, then linked), so no target
/// can open it first.
fn open_append(path: &Path, protected: Option<&ProtectedFiles>) -> io::Result<File> {
    let Some(protected) = protected else {
        return append(path);
    };
    match OpenOptions::new().append(true).open(path) {
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        existing => return existing,
    }
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let unnamed = OpenOptions::new()
        .append(true)
        .mode(0o666)
        .custom_flags(libc::O_TMPFILE)
        .open(dir);
    let file = match unnamed {
        Ok(file) => file,
        // A file system without unnamed files: protected just after it is created.
        Err(err) if matches!(err.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EISDIR)) => {
            return append(path);
        }
        Err(err) => return Err(err),
    };
    if let Err(err) = protected.protect_file(&file, Protection::ChangeAndRead) {
        warn!(
            "{err}: targets may read or change the event file {}",
            path.display()
        );
    }
    let name = CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: an open descriptor and a NUL-terminated path.
    let linked = unsafe {
        libc::linkat(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            name.as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    };
    if linked != 0 {
        let err = io::Error::last_os_error();
        return match err.kind() {
            // Created meanwhile: appended to as found (and protected with the rotation).
            io::ErrorKind::AlreadyExists => OpenOptions::new().append(true).open(path),
            _ => Err(err),
        };
    }
    Ok(file)
}

impl RotatingFile {
    /// `protected`: where to keep the files from targets (None: nothing enforces).
    pub fn open(
        path: &Path,
        rotation: Rotation,
        protected: Option<ProtectedFiles>,
    ) -> io::Result<Self> {
        let mut opened = Self {
            path: path.to_owned(),
            rotation,
            file: None,
            size: 0,
            committed: 0,
            protected,
            kept: HashSet::new(),
        };
        opened.reopen()?;
        Ok(opened)
    }

    /// Opens the file to append to, and protects the files of the rotation.
    fn reopen(&mut self) -> io::Result<()> {
        let file = open_append(&self.path, self.protected.as_ref())?;
        self.size = file.metadata()?.len();
        self.committed = self.size;
        self.file = Some(file);
        self.protect_rotation();
        Ok(())
    }

    /// After a failed write: cuts the file back to its last whole batch, and closes it.
    fn abandon_batch(&mut self) {
        if let Some(file) = self.file.take()
            && self.size > self.committed
            && let Err(err) = file.set_len(self.committed)
        {
            warn!(
                "cutting the event file {} back to its last whole batch: {err}",
                self.path.display()
            );
        }
    }

    fn rotated(&self, index: u32) -> PathBuf {
        let mut name = self.path.clone().into_os_string();
        name.push(format!(".{index}"));
        PathBuf::from(name)
    }

    /// Protects the files of the rotation there are, and releases those gone (a gone file's
    /// inode number may be given to another file).
    fn protect_rotation(&mut self) {
        let Some(protected) = &self.protected else {
            return;
        };
        let files = std::iter::once(self.path.clone())
            .chain((1..=self.rotation.keep).map(|index| self.rotated(index)));
        let mut kept = HashSet::new();
        for path in files {
            match protected.protect(&path, Protection::ChangeAndRead) {
                Ok(key) => {
                    kept.insert(key);
                }
                Err(ProtectError::Stat { source, .. })
                    if source.kind() == io::ErrorKind::NotFound => {}
                Err(err) => warn!("{err}: targets may read or change it"),
            }
        }
        for gone in self.kept.difference(&kept) {
            if let Err(err) = protected.release(*gone) {
                warn!("releasing a rotated event file's protection: {err}");
            }
        }
        self.kept = kept;
    }

    fn rotate(&mut self) -> io::Result<()> {
        let ignore_missing = |result: io::Result<()>| match result {
            Err(err) if err.kind() != io::ErrorKind::NotFound => Err(err),
            _ => Ok(()),
        };
        if self.rotation.keep == 0 {
            ignore_missing(std::fs::remove_file(&self.path))?;
        } else {
            for index in (1..self.rotation.keep).rev() {
                ignore_missing(std::fs::rename(
                    self.rotated(index),
                    self.rotated(index + 1),
                ))?;
            }
            std::fs::rename(&self.path, self.rotated(1))?;
        }
        self.file = None;
        self.reopen()
    }

    /// Writes the lines of `buf` that fit in the file, rotating it first if none does.
    fn write_lines(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.file.is_none() {
            // After a failure: the file as it is now.
            self.reopen()?;
        }
        let mut fitting = whole_lines(buf, self.rotation.max_bytes.saturating_sub(self.size));
        if fitting == 0 && self.size > 0 {
            self.rotate()?;
            fitting = whole_lines(buf, self.rotation.max_bytes);
        }
        if fitting == 0 {
            // A line longer than a whole file: alone in its file.
            fitting = buf
                .iter()
                .position(|&byte| byte == b'\n')
                .map_or(buf.len(), |end| end + 1);
        }
        let file = self
            .file
            .as_mut()
            .expect("opened above, or by the rotation");
        let written = file.write(&buf[..fitting])?;
        self.size += written as u64;
        Ok(written)
    }
}

/// How much of `lines` (whole lines) fits in `room` bytes.
fn whole_lines(lines: &[u8], room: u64) -> usize {
    if lines.len() as u64 <= room {
        return lines.len();
    }
    lines[..room as usize]
        .iter()
        .rposition(|&byte| byte == b'\n')
        .map_or(0, |last| last + 1)
}

impl Write for RotatingFile {
    /// Callers write whole lines: a line is never split across files, and a file holds more than
    /// `max_bytes` only when it is one line longer than that.
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let written = self.write_lines(buf);
        if written.is_err() {
            self.abandon_batch();
        }
        written
    }

    fn flush(&mut self) -> io::Result<()> {
        if let Some(file) = &mut self.file {
            file.flush()?;
        }
        self.committed = self.size;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer whose writes fail while `full` is set.
    struct Disk {
        full: std::sync::Arc<std::sync::atomic::AtomicBool>,
    }

    impl Write for Disk {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.full.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(io::ErrorKind::StorageFull.into());
            }
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_that_cannot_be_written_are_lost_and_counted_until_writing_works() {
        let full = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let mut sink = JsonLines::new("disk", Box::new(Disk { full: full.clone() }));
        let failure = ModuleFailure {
            kind: "rule_module_failure",
            time: crate::events::rfc3339_nanos(std::time::SystemTime::UNIX_EPOCH),
            node: "node-1".to_owned(),
            module: "m".to_owned(),
            failure: "timeout",
            message: String::new(),
            events: 1,
            on_failure: "keep",
        };
        sink.report(&failure);
        sink.report(&failure);
        sink.flush();
        assert_eq!(
            (sink.lost(), sink.failing),
            (2, Some((2, io::ErrorKind::StorageFull)))
        );
        // A batch with nothing in it says nothing about the disk.
        full.store(false, std::sync::atomic::Ordering::Relaxed);
        sink.flush();
        assert_eq!(sink.failing, Some((2, io::ErrorKind::StorageFull)));
        sink.report(&failure);
        sink.flush();
        assert_eq!((sink.lost(), sink.failing), (2, None));
    }

    #[test]
    fn rotates_at_line_boundaries_and_keeps_the_newest_files() {
        let dir = std::env::temp_dir().join(format!("palisade-rotate-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("events.jsonl");
        let rotation = Rotation {
            max_bytes: 100,
            keep: 2,
        };
        let mut file = RotatingFile::open(&path, rotation, None).unwrap();
        for i in 0..20 {
            file.write_all(format!("{{\"event\":{i:03},\"padding\":\"xxxxxxxxxx\"}}\n").as_bytes())
                .unwrap();
        }
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
        // 37-byte lines, two per file; the last two lines are in the current file.
        assert_eq!(read("events.jsonl").lines().count(), 2);
        assert!(read("events.jsonl").contains("\"event\":019"));
        assert!(read("events.jsonl.1").contains("\"event\":017"));
        assert!(read("events.jsonl.2").contains("\"event\":015"));
        assert!(
            !dir.join("events.jsonl.3").exists(),
            "only `keep` rotated files"
        );
        for name in ["events.jsonl", "events.jsonl.1", "events.jsonl.2"] {
            let text = read(name);
            assert!(
                text.len() <= 100 && text.ends_with('\n'),
                "{name}: {text:?}"
            );
        }
        // A batch of lines at once is split between files at line boundaries too.
        let batch: String = (20..30)
            .map(|i| format!("{{\"event\":{i:03},\"padding\":\"xxxxxxxxxx\"}}\n"))
            .collect();
        file.write_all(batch.as_bytes()).unwrap();
        assert!(read("events.jsonl").contains("\"event\":029"));
        assert!(read("events.jsonl.1").contains("\"event\":027"));
        for name in ["events.jsonl", "events.jsonl.1", "events.jsonl.2"] {
            let text = read(name);
            assert_eq!(text.lines().count(), 2, "{name}: {text:?}");
        }
        // Reopening appends to what is there.
        drop(file);
        let mut file = RotatingFile::open(&path, rotation, None).unwrap();
        file.write_all(b"{}\n").unwrap();
        assert_eq!(read("events.jsonl").lines().count(), 3);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
