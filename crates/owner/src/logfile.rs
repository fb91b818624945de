//! `<home>/logs/daemon.log` (SPEC section 8): private (0600) and bounded in size.
//!
//! The file is cut at the first line end past [`MAX_BYTES`]: `daemon.log` becomes `daemon.log.1`, `.1`
//! becomes `.2`, and so on up to [`KEEP`]; the oldest is dropped. So the daemon's logs never
//! take more than about `(KEEP + 1) * MAX_BYTES` of disk, whatever a client makes it log.
//! `tracing-appender` rotates by time only and renames the live file, which would break the
//! spec's fixed `daemon.log` path; this writer is small enough to keep here.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A log file is cut after this many bytes (10 MiB).
pub const MAX_BYTES: u64 = 10 * 1024 * 1024;

/// Cut files kept besides the live one.
pub const KEEP: u32 = 4;

/// An append-only log file that rotates by size. Write errors are returned to the caller
/// (tracing drops them); a failed rotation keeps writing to the current file.
pub struct RotatingLog {
    path: PathBuf,
    max_bytes: u64,
    keep: u32,
    file: File,
    written: u64,
    /// The last byte written ended a line: files are cut between lines only.
    at_line_start: bool,
}

impl RotatingLog {
    /// Opens (or creates, 0600) `path` for appending. An existing file is made 0600 too: older
    /// drovers left it 0644.
    pub fn open(path: &Path, max_bytes: u64, keep: u32) -> io::Result<RotatingLog> {
        let file = open_private(path)?;
        let written = file.metadata()?.len();
        Ok(RotatingLog {
            path: path.to_path_buf(),
            max_bytes: max_bytes.max(1),
            keep,
            file,
            written,
            at_line_start: true,
        })
    }

    fn rotated(&self, n: u32) -> PathBuf {
        let mut p = self.path.as_os_str().to_owned();
        p.push(format!(".{n}"));
        PathBuf::from(p)
    }

    fn rotate(&mut self) -> io::Result<()> {
        if self.keep == 0 {
            self.file.set_len(0)?;
            self.written = 0;
            return Ok(());
        }
        let _ = std::fs::remove_file(self.rotated(self.keep));
        for n in (1..self.keep).rev() {
            match std::fs::rename(self.rotated(n), self.rotated(n + 1)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        match std::fs::rename(&self.path, self.rotated(1)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        self.file = open_private(&self.path)?;
        self.written = 0;
        Ok(())
    }
}

impl Write for RotatingLog {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.at_line_start && self.written >= self.max_bytes {
            if let Err(e) = self.rotate() {
                // Keep logging to the file we have; the next write tries again.
                let _ = writeln!(
                    io::stderr(),
                    "drover: cannot rotate {}: {e}",
                    self.path.display()
                );
            }
        }
        let n = self.file.write(buf)?;
        self.written += n as u64;
        if n > 0 {
            self.at_line_start = buf[n - 1] == b'\n';
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// Opens (or creates) `path` for appending, 0600.
pub(crate) fn open_private(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_cut_by_size_and_the_oldest_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("daemon.log");
        std::fs::write(&path, "old\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut log = RotatingLog::open(&path, 100, 2).unwrap();
        for i in 0..50 {
            writeln!(log, "line {i:04} of the log").unwrap();
        }
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["daemon.log", "daemon.log.1", "daemon.log.2"]);
        for name in &names {
            let meta = std::fs::metadata(dir.path().join(name)).unwrap();
            // Cut at the first line end past 100 bytes: at most one 21-byte line over.
            assert!(meta.len() <= 121, "{name}: {}", meta.len());
            assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{name}");
        }
        let live = std::fs::read_to_string(&path).unwrap();
        assert!(live.ends_with("line 0049 of the log\n"), "{live}");
    }
}
