//! Where decoded events go: JSON lines to a writer (stdout, or a file rotated by size so that a
//! long-running agent under attack cannot fill the disk), and the other sinks beside it.

use std::{
    fs::{File, OpenOptions},
    io::{self, Write},
    path::{Path, PathBuf},
};

use super::{AuditEvent, ModuleFailure};

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

/// One JSON object per line, a batch of lines per write.
pub struct JsonLines {
    name: String,
    writer: Box<dyn Write + Send>,
    /// The lines of the batch, not yet written.
    batch: Vec<u8>,
    lines: u64,
    failed: u64,
}

impl JsonLines {
    pub fn new(name: impl Into<String>, writer: Box<dyn Write + Send>) -> Self {
        Self {
            name: name.into(),
            writer,
            batch: Vec::new(),
            lines: 0,
            failed: 0,
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
        let written = self
            .writer
            .write_all(&self.batch)
            .and_then(|()| self.writer.flush());
        if written.is_err() {
            self.failed += self.lines;
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

pub struct RotatingFile {
    path: PathBuf,
    rotation: Rotation,
    file: File,
    size: u64,
}

fn append(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

impl RotatingFile {
    pub fn open(path: &Path, rotation: Rotation) -> io::Result<Self> {
        let file = append(path)?;
        let size = file.metadata()?.len();
        Ok(Self {
            path: path.to_owned(),
            rotation,
            file,
            size,
        })
    }

    fn rotated(&self, index: u32) -> PathBuf {
        let mut name = self.path.clone().into_os_string();
        name.push(format!(".{index}"));
        PathBuf::from(name)
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
        self.file = append(&self.path)?;
        self.size = 0;
        Ok(())
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
        let written = self.file.write(&buf[..fitting])?;
        self.size += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let mut file = RotatingFile::open(&path, rotation).unwrap();
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
        let mut file = RotatingFile::open(&path, rotation).unwrap();
        file.write_all(b"{}\n").unwrap();
        assert_eq!(read("events.jsonl").lines().count(), 3);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
