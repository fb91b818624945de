//! The start-up check of `state.db` (SPEC section 3): is this a drover ledger, and is it whole?
//!
//! The check reads through a read-only connection, which can neither write the file nor
//! checkpoint its WAL when it closes, so a damaged ledger is copied aside exactly as it was
//! found. A file is a drover ledger when its header (or, read through SQLite, its
//! `application_id`) says `DRVR`, or when its schema has drover's tables: a ledger whose first
//! page is hurt is still named as drover's, not as someone else's file.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags};

use crate::schema::APPLICATION_ID;
use crate::LedgerError;

/// The first bytes of every SQLite 3 database file.
const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";

/// At most this much of `quick_check`'s report goes into the error message.
const DETAIL_MAX: usize = 400;

/// Checks an existing, non-empty `path`. A missing or empty file passes: it becomes a new
/// ledger (the owner decides first whether an empty one is a loss).
pub(crate) fn check(path: &Path) -> Result<(), LedgerError> {
    let header = read_header(path);
    if header.is_empty() {
        return Ok(());
    }
    let foreign = |detail: String| LedgerError::ForeignFile {
        path: path.to_path_buf(),
        detail,
    };
    if !header.starts_with(SQLITE_MAGIC) {
        return Err(foreign("not an SQLite database".into()));
    }
    let header_says_drover = header
        .get(68..72)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .is_some_and(|b| i64::from(u32::from_be_bytes(b)) == APPLICATION_ID);
    // Only corruption is damage: a busy or unreadable file is a storage error, and is not
    // copied aside.
    let refuse = |e: rusqlite::Error, drover: bool| {
        if !crate::is_corruption(&e) {
            LedgerError::Storage(e)
        } else if drover {
            damaged(path, e.to_string())
        } else {
            foreign(e.to_string())
        }
    };
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| refuse(e, header_says_drover))?;
    let app_id = conn.query_row("PRAGMA application_id", [], |r| r.get::<_, i64>(0));
    let has_drover_tables = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' \
             AND name IN ('session_admissions', 'runtime_epoch')",
            [],
            |r| r.get::<_, i64>(0),
        )
        .map(|n| n == 2);
    let drover = header_says_drover
        || app_id.as_ref().is_ok_and(|id| *id == APPLICATION_ID)
        || has_drover_tables.as_ref().is_ok_and(|yes| *yes);
    if !drover {
        // Foreign, or a fresh empty SQLite file: `schema::migrate` tells which.
        return match app_id.and(has_drover_tables) {
            Ok(_) => Ok(()),
            Err(e) => Err(refuse(e, false)),
        };
    }
    let report: Result<Vec<String>, rusqlite::Error> = conn
        .prepare("PRAGMA quick_check")
        .and_then(|mut st| st.query_map([], |r| r.get::<_, String>(0))?.collect());
    match report {
        Ok(lines) if lines.len() == 1 && lines[0] == "ok" => Ok(()),
        Ok(lines) => Err(damaged(path, format!("quick_check: {}", lines.join("; ")))),
        Err(e) if crate::is_corruption(&e) => Err(damaged(path, format!("quick_check: {e}"))),
        Err(e) => Err(LedgerError::Storage(e)),
    }
}

/// The first 100 bytes (SQLite's database header), or fewer for a short file.
fn read_header(path: &Path) -> Vec<u8> {
    use std::io::Read;
    let mut buf = Vec::with_capacity(100);
    if let Ok(f) = std::fs::File::open(path) {
        let _ = f.take(100).read_to_end(&mut buf);
    }
    buf
}

/// The error for a damaged drover ledger, after copying it aside.
pub(crate) fn damaged(path: &Path, mut detail: String) -> LedgerError {
    if detail.len() > DETAIL_MAX {
        let mut cut = DETAIL_MAX;
        while !detail.is_char_boundary(cut) {
            cut -= 1;
        }
        detail.truncate(cut);
        detail.push_str(" ...");
    }
    match set_aside(path) {
        Ok(backup) => LedgerError::Damaged {
            path: path.to_path_buf(),
            detail,
            backup,
        },
        Err(e) => LedgerError::Unavailable(format!(
            "{} is a damaged drover ledger ({detail}), and it could not be copied aside: {e}; \
             drover will not start on it",
            path.display()
        )),
    }
}

/// Copies `path` (and its `-wal`, if any) to `<path>.damaged-<unix seconds>[-<n>]`, mode
/// 0600, and gives the copy's path. Used before refusing a ledger, so what was found survives
/// whatever is done to the home next.
pub fn set_aside(path: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::OpenOptionsExt;
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let base = format!("{}.damaged-{secs}", path.display());
    let mut n = 0u32;
    let (backup, mut out) = loop {
        let candidate = if n == 0 {
            PathBuf::from(&base)
        } else {
            PathBuf::from(format!("{base}-{n}"))
        };
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&candidate)
        {
            Ok(f) => break (candidate, f),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 100 => n += 1,
            Err(e) => return Err(e),
        }
    };
    std::io::copy(&mut std::fs::File::open(path)?, &mut out)?;
    out.sync_all()?;
    let wal = with_suffix(path, "-wal");
    if wal.exists() {
        let mut wal_out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(with_suffix(&backup, "-wal"))?;
        std::io::copy(&mut std::fs::File::open(&wal)?, &mut wal_out)?;
        wal_out.sync_all()?;
    }
    Ok(backup)
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Ledger;

    /// A ledger with enough rows in `state_meta` that its b-tree has interior pages.
    fn ledger_with_rows(path: &Path) -> i64 {
        let ledger = Ledger::open(path).expect("open");
        ledger
            .conn
            .execute_batch(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000)
                 INSERT INTO state_meta (key, value) SELECT 'k' || i, hex(randomblob(64)) FROM n;
                 PRAGMA wal_checkpoint(TRUNCATE);",
            )
            .expect("rows");
        let root: i64 = ledger
            .conn
            .query_row(
                "SELECT rootpage FROM sqlite_master WHERE name = 'state_meta'",
                [],
                |r| r.get(0),
            )
            .expect("rootpage");
        let page_size: i64 = ledger
            .conn
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .expect("page_size");
        drop(ledger);
        (root - 1) * page_size
    }

    #[test]
    fn a_whole_ledger_passes_and_reopens() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.db");
        ledger_with_rows(&path);
        Ledger::open(&path).expect("reopen");
    }

    #[test]
    fn a_corrupt_interior_page_is_named_damaged_and_copied_aside_untouched() {
        use std::io::{Seek, SeekFrom, Write};
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.db");
        let offset = ledger_with_rows(&path);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        f.seek(SeekFrom::Start(offset as u64)).expect("seek");
        f.write_all(&[0xEE; 64]).expect("corrupt");
        drop(f);
        let before = std::fs::read(&path).expect("read");
        let err = Ledger::open(&path).err().expect("damaged ledger opened");
        let LedgerError::Damaged { backup, detail, .. } = &err else {
            panic!("{err}");
        };
        assert!(detail.contains("quick_check"), "{err}");
        assert!(err.to_string().contains("damaged drover ledger"), "{err}");
        assert_eq!(std::fs::read(backup).expect("backup"), before);
        assert_eq!(std::fs::read(&path).expect("read"), before, "written");
    }

    #[test]
    fn a_corrupt_schema_page_is_named_damaged_not_foreign() {
        use std::io::{Seek, SeekFrom, Write};
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.db");
        ledger_with_rows(&path);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        // The header (with its application id) survives; the schema's b-tree after it does not.
        f.seek(SeekFrom::Start(100)).expect("seek");
        f.write_all(&[0xEE; 400]).expect("corrupt");
        drop(f);
        let err = Ledger::open(&path).err().expect("opened");
        assert!(matches!(err, LedgerError::Damaged { .. }), "{err}");
    }

    #[test]
    fn a_second_writer_of_the_same_file_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.db");
        let _first = Ledger::open(&path).expect("open");
        let err = Ledger::open(&path).err().expect("second writer");
        assert!(matches!(err, LedgerError::InUse { .. }), "{err}");
    }
}
