//! The worker's journal: the outbox of persist frames not yet answered by the owner
//! (SPEC section 4: "The worker keeps unsent persists in an outbox file under
//! `<home>/outbox/<execution_id>/` and sends them again, in order, after a broken pipe").
//!
//! Layout: one file per frame, `<sequence as 20 zero-padded digits>.json`, holding the
//! [`PersistFrame`] without its `secret` (files 0600, directories 0700). The secret stays in
//! memory: the journal puts the scope's secret back into every frame it loads, so no outbox
//! file, pending, answered or left by a killed worker, ever holds it (drover issue 8: another
//! worker of the same user could read it there). A frame is
//! written (temp file, rename) by [`Journal::record`] before it may be sent, not fsync'd: an
//! outbox serves resends only while this worker and its owner both live (a worker whose owner
//! died stops, and a later owner refuses an older epoch's frames), so surviving a machine crash
//! buys nothing (docs/decisions.md, "The worker's outbox is not fsync'd");
//! [`Journal::acknowledge`] deletes it once the owner answered (receipt or refusal).
//! [`Journal::open`] reloads what is left, so a restarted sender resends the same frames with
//! the same sequences and payloads. This module is plain, synchronous file IO, the bottom layer
//! of the crate: the link above it runs it on its own thread and carries the frames.

use std::collections::BTreeMap;
use std::fs::{self, DirBuilder, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use drover_protocol::worker::{PersistFrame, Scope, WorkerFrame, MAX_FRAME_BYTES};
use serde_json::Value;

/// Digits of the zero-padded sequence in a frame's file name (`u64::MAX` has 20).
const SEQUENCE_DIGITS: usize = 20;

/// Why the journal could not record, load or delete a frame.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// A file or directory operation failed; `path` says which.
    #[error("outbox {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A frame file could not be parsed (or belongs to another execution).
    #[error(
        "outbox frame {path} is unreadable: {detail}; remove the file if the execution is settled"
    )]
    Corrupt {
        /// The frame file.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// The frame's wire line would exceed [`MAX_FRAME_BYTES`]; nothing was written and the
    /// sequence was not used.
    #[error("{operation} frame would be {bytes} bytes, over the {MAX_FRAME_BYTES}-byte frame limit; it was not recorded or sent")]
    FrameTooLarge {
        /// The persist operation (`transcript.append`, ...).
        operation: String,
        /// The wire line's length.
        bytes: usize,
    },
    /// The execution id cannot name a directory.
    #[error("execution_id {0:?} cannot name an outbox directory (empty, or has `/` or `..`)")]
    BadExecutionId(String),
    /// The outbox thread of the link has stopped, so the outbox cannot be changed any more.
    #[error("the outbox thread has stopped")]
    Stopped,
}

impl JournalError {
    fn io(path: &Path, source: io::Error) -> JournalError {
        JournalError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// `<home>/outbox/<execution_id>`, checking that the id is a single path component.
pub fn outbox_dir(home: &Path, execution_id: &str) -> Result<PathBuf, JournalError> {
    if execution_id.is_empty()
        || execution_id == "."
        || execution_id == ".."
        || execution_id.contains('/')
        || execution_id.contains('\0')
    {
        return Err(JournalError::BadExecutionId(execution_id.to_string()));
    }
    Ok(home.join("outbox").join(execution_id))
}

/// The outbox of one execution. See the module doc for the layout and rules.
pub struct Journal {
    dir: PathBuf,
    scope: Scope,
    next_sequence: u64,
    pending: BTreeMap<u64, PersistFrame>,
}

/// Shows no frame and no secret, so a logged journal never leaks the execution secret.
impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("dir", &self.dir)
            .field("execution_id", &self.scope.execution_id)
            .field("next_sequence", &self.next_sequence)
            .field("unacknowledged", &self.pending.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Journal {
    /// Opens (creating, 0700) the outbox `dir` for `scope` and reloads the frames left in it.
    /// The next sequence is one past the highest found (1 for an empty outbox). Leftover
    /// temporary files of an interrupted write are removed.
    pub fn open(dir: impl Into<PathBuf>, scope: Scope) -> Result<Journal, JournalError> {
        let dir = dir.into();
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| JournalError::io(&dir, e))?;
        // An existing folder keeps its mode through `create`: make it private either way.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))
            .map_err(|e| JournalError::io(&dir, e))?;
        let mut pending = BTreeMap::new();
        let entries = fs::read_dir(&dir).map_err(|e| JournalError::io(&dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| JournalError::io(&dir, e))?;
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.ends_with(".tmp") {
                // Never renamed into place, so never sent: safe to drop.
                fs::remove_file(&path).map_err(|e| JournalError::io(&path, e))?;
                continue;
            }
            let Some(sequence) = parse_file_name(&name) else {
                tracing::warn!(path = %path.display(), "ignoring a foreign file in the outbox");
                continue;
            };
            let frame = load_frame(&path, scope.secret.expose())?;
            if frame.sequence != sequence || frame.execution_id != scope.execution_id {
                return Err(JournalError::Corrupt {
                    path,
                    detail: format!(
                        "holds sequence {} of execution {:?}",
                        frame.sequence, frame.execution_id
                    ),
                });
            }
            pending.insert(sequence, frame);
        }
        let next_sequence = pending.keys().next_back().map_or(1, |last| last + 1);
        Ok(Journal {
            dir,
            scope,
            next_sequence,
            pending,
        })
    }

    /// The outbox directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The sequence the next [`Journal::record`] will use.
    pub fn next_sequence(&self) -> u64 {
        self.next_sequence
    }

    /// Builds the frame for `operation` with the next sequence and writes it (temp file, then
    /// rename, so a file is whole or absent). Only then may it be sent.
    ///
    /// Errors: [`JournalError::FrameTooLarge`] when the wire line would exceed
    /// [`MAX_FRAME_BYTES`] (nothing written, sequence not used); [`JournalError::Io`].
    pub fn record(
        &mut self,
        operation: &str,
        payload: Value,
    ) -> Result<PersistFrame, JournalError> {
        let frame = PersistFrame {
            epoch: self.scope.epoch,
            execution_id: self.scope.execution_id.clone(),
            generation: self.scope.generation,
            sequence: self.next_sequence,
            operation: operation.to_string(),
            payload,
            secret: self.scope.secret.clone(),
        };
        let bytes = wire_line(&frame).len();
        if bytes > MAX_FRAME_BYTES {
            return Err(JournalError::FrameTooLarge {
                operation: operation.to_string(),
                bytes,
            });
        }
        let body = stored_body(&frame).map_err(|e| JournalError::Corrupt {
            path: self.frame_path(frame.sequence),
            detail: format!("cannot serialise: {e}"),
        })?;
        let path = self.frame_path(frame.sequence);
        let tmp = path.with_extension("json.tmp");
        write_private(&tmp, &body)?;
        fs::rename(&tmp, &path).map_err(|e| JournalError::io(&path, e))?;
        self.next_sequence += 1;
        self.pending.insert(frame.sequence, frame.clone());
        Ok(frame)
    }

    /// The owner answered `sequence` (receipt or refusal): delete its file. Unknown or already
    /// acknowledged sequences are not an error. Returns whether the frame was pending.
    pub fn acknowledge(&mut self, sequence: u64) -> Result<bool, JournalError> {
        let was_pending = self.pending.remove(&sequence).is_some();
        let path = self.frame_path(sequence);
        match fs::remove_file(&path) {
            Ok(()) => Ok(was_pending),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(was_pending),
            Err(e) => Err(JournalError::io(&path, e)),
        }
    }

    /// The unacknowledged frame with this `sequence`, if any.
    pub fn frame(&self, sequence: u64) -> Option<&PersistFrame> {
        self.pending.get(&sequence)
    }

    /// The frames not yet acknowledged, in sequence order.
    pub fn unacknowledged(&self) -> Vec<PersistFrame> {
        self.pending.values().cloned().collect()
    }

    /// Removes the outbox directory and anything left in it. Call once the owner acknowledged
    /// `execution.finish`: the execution is terminal then and the owner answers nothing more of
    /// it, so a frame still listed (a `prompt.open` whose answer was abandoned by a stop) is
    /// moot.
    pub fn finish(self) -> Result<(), JournalError> {
        if !self.pending.is_empty() {
            tracing::debug!(
                left = self.pending.len(),
                "removing outbox with frames the owner settled by execution.finish"
            );
        }
        match fs::remove_dir_all(&self.dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(JournalError::io(&self.dir, e)),
        }
    }

    fn frame_path(&self, sequence: u64) -> PathBuf {
        self.dir
            .join(format!("{sequence:0width$}.json", width = SEQUENCE_DIGITS))
    }
}

/// The JSON line (without newline) that carries `frame` to the owner.
pub fn wire_line(frame: &PersistFrame) -> String {
    // Serialising plain data with string keys cannot fail.
    serde_json::to_string(&WorkerFrame::Persist(frame.clone())).unwrap_or_default()
}

fn parse_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".json")?;
    if digits.len() != SEQUENCE_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The file body of `frame`: the frame without its `secret`.
fn stored_body(frame: &PersistFrame) -> Result<Vec<u8>, serde_json::Error> {
    let mut value = serde_json::to_value(frame)?;
    if let Some(obj) = value.as_object_mut() {
        obj.remove("secret");
    }
    serde_json::to_vec(&value)
}

/// Reads a frame file and gives the frame `secret` back. A file that holds a secret (written
/// before frames were stored without one) must hold this one: anything else belongs to
/// another execution.
fn load_frame(path: &Path, secret: &str) -> Result<PersistFrame, JournalError> {
    let corrupt = |detail: String| JournalError::Corrupt {
        path: path.to_path_buf(),
        detail,
    };
    let body = fs::read(path).map_err(|e| JournalError::io(path, e))?;
    let mut value: Value = serde_json::from_slice(&body).map_err(|e| corrupt(e.to_string()))?;
    let obj = value
        .as_object_mut()
        .ok_or_else(|| corrupt("not a JSON object".to_string()))?;
    match obj.get("secret").and_then(Value::as_str) {
        None => {}
        Some(stored) if stored == secret => {}
        Some(_) => return Err(corrupt("holds another execution's secret".to_string())),
    }
    obj.insert("secret".into(), Value::String(secret.to_string()));
    serde_json::from_value(value).map_err(|e| corrupt(e.to_string()))
}

fn write_private(path: &Path, body: &[u8]) -> Result<(), JournalError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| JournalError::io(path, e))?;
    // `mode` applies only to a new file: a leftover one is made private too.
    file.set_permissions(fs::Permissions::from_mode(0o600))
        .map_err(|e| JournalError::io(path, e))?;
    file.write_all(body).map_err(|e| JournalError::io(path, e))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn scope() -> Scope {
        Scope {
            session_id: "s1".into(),
            admission_id: "a1".into(),
            execution_id: "e1".into(),
            generation: 3,
            epoch: 7,
            secret: "sekret".into(),
        }
    }

    /// An empty outbox for execution `e1` in a new home.
    fn fresh() -> (tempfile::TempDir, PathBuf, Journal) {
        let home = tempfile::tempdir().expect("tempdir");
        let dir = outbox_dir(home.path(), "e1").expect("dir");
        let journal = Journal::open(&dir, scope()).expect("open");
        (home, dir, journal)
    }

    #[test]
    fn record_numbers_frames_from_one_and_writes_private_files() {
        let (_home, dir, mut journal) = fresh();
        let first = journal
            .record("usage.add", json!({"n": 1}))
            .expect("record");
        let second = journal
            .record("transcript.append", json!({"n": 2}))
            .expect("record");
        assert_eq!((first.sequence, second.sequence), (1, 2));
        assert_eq!(
            (first.epoch, first.generation, first.secret.expose()),
            (7, 3, "sekret")
        );
        let file = dir.join("00000000000000000001.json");
        let mode = fs::metadata(&file).expect("file").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let dir_mode = fs::metadata(&dir).expect("dir").permissions().mode();
        assert_eq!(dir_mode & 0o777, 0o700);
        let text = fs::read_to_string(&file).expect("read");
        assert!(!text.contains("sekret"), "the secret is on disk: {text}");
        let mut stored: Value = serde_json::from_str(&text).expect("frame");
        stored["secret"] = json!("sekret");
        assert_eq!(
            serde_json::from_value::<PersistFrame>(stored).expect("frame"),
            first
        );
    }

    #[test]
    fn reloaded_frames_get_the_scope_secret_and_a_foreign_secret_is_refused() {
        let (_home, dir, mut journal) = fresh();
        let frame = journal
            .record("usage.add", json!({"n": 1}))
            .expect("record");
        drop(journal);
        let reopened = Journal::open(&dir, scope()).expect("reopen");
        assert_eq!(reopened.unacknowledged(), vec![frame.clone()]);
        drop(reopened);

        // A file of an older drover still holds a secret: only this execution's is accepted.
        let file = dir.join("00000000000000000001.json");
        let mut old = serde_json::to_value(&frame).expect("value");
        old["secret"] = json!("s3cr3t-of-e2");
        fs::write(&file, old.to_string()).expect("write");
        let err = Journal::open(&dir, scope()).expect_err("foreign secret");
        assert!(matches!(err, JournalError::Corrupt { .. }), "{err}");
        assert!(!err.to_string().contains("s3cr3t"), "{err}");
    }

    #[test]
    fn acknowledge_deletes_and_unacknowledged_lists_the_rest_in_order() {
        let (_home, dir, mut journal) = fresh();
        for n in 1..=3 {
            journal
                .record("usage.add", json!({"n": n}))
                .expect("record");
        }
        assert!(journal.acknowledge(2).expect("ack"));
        assert!(!journal.acknowledge(2).expect("ack twice"));
        let left: Vec<u64> = journal
            .unacknowledged()
            .iter()
            .map(|f| f.sequence)
            .collect();
        assert_eq!(left, vec![1, 3]);
        assert!(!dir.join("00000000000000000002.json").exists());
    }

    #[test]
    fn reopened_journal_sees_unacknowledged_frames_and_continues_the_sequence() {
        let (_home, dir, mut journal) = fresh();
        let frames: Vec<PersistFrame> = (1..=3)
            .map(|n| {
                journal
                    .record("usage.add", json!({"n": n}))
                    .expect("record")
            })
            .collect();
        journal.acknowledge(1).expect("ack");
        drop(journal);
        fs::write(dir.join("00000000000000000009.json.tmp"), b"{half").expect("tmp");

        let mut reopened = Journal::open(&dir, scope()).expect("reopen");
        assert_eq!(reopened.unacknowledged(), frames[1..].to_vec());
        assert_eq!(reopened.next_sequence(), 4);
        assert!(!dir.join("00000000000000000009.json.tmp").exists());
        let next = reopened
            .record("execution.finish", json!({}))
            .expect("record");
        assert_eq!(next.sequence, 4);
    }

    #[test]
    fn oversize_frame_is_refused_without_using_a_sequence() {
        let (_home, dir, mut journal) = fresh();
        let big = "x".repeat(MAX_FRAME_BYTES);
        let err = journal
            .record("transcript.append", json!({ "text": big }))
            .expect_err("too large");
        assert!(matches!(err, JournalError::FrameTooLarge { .. }), "{err}");
        assert!(err.to_string().contains("transcript.append"), "{err}");
        assert_eq!(journal.next_sequence(), 1);
        assert!(journal.unacknowledged().is_empty());
        assert_eq!(fs::read_dir(&dir).expect("dir").count(), 0);
    }

    #[test]
    fn finish_removes_the_outbox_directory() {
        let (home, dir, mut journal) = fresh();
        journal
            .record("execution.finish", json!({}))
            .expect("record");
        journal.acknowledge(1).expect("ack");
        journal.finish().expect("finish");
        assert!(!dir.exists());
        assert!(home.path().join("outbox").exists());
    }

    #[test]
    fn execution_ids_that_are_not_one_path_component_are_refused() {
        let home = Path::new("/tmp/h");
        for bad in ["", "..", "a/b", "."] {
            assert!(outbox_dir(home, bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            outbox_dir(home, "exec-1").expect("ok"),
            PathBuf::from("/tmp/h/outbox/exec-1")
        );
    }
}
