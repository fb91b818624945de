//! The worker's journal: the outbox of persist frames not yet answered by the owner
//! (SPEC section 4: "The worker keeps unsent persists in an outbox file under
//! `<home>/outbox/<execution_id>/` and sends them again, in order, after a broken pipe").
//!
//! Layout: one file per frame or batch sent, named by its first sequence, `<sequence as 20
//! zero-padded digits>.json`: a [`PersistFrame`] alone (a JSON object) or the frames of one
//! batch in sequence order (a JSON array), each without its `secret` (files 0600, directories
//! 0700). The secret stays in memory: the journal puts the scope's secret back into every
//! frame it loads, so no outbox file, pending, answered or left by a killed worker, ever holds
//! it (another worker of the same user could read it there).
//!
//! [`Journal::hold`] keeps a frame in memory only: it is not sent until the next
//! [`Journal::record`], which writes it and the held frames before it as one file (temp file,
//! rename) before any of them may be sent (a text turn's end is one file, not three).
//! Files are not fsync'd: an outbox serves resends only while this worker and its owner both
//! live (a worker whose owner died stops, and a later owner refuses an older epoch's frames),
//! so surviving a machine crash buys nothing (docs/decisions/turn-worker-outbox-not-fsyncd.md).
//! [`Journal::acknowledge`] empties a file once the owner answered (receipt or
//! refusal) every frame in it and renames it to a spare file (`.spare-<n>`,
//! [`OUTBOX_SPARE_PREFIX`]), which the next write fills and renames into place instead of
//! creating a file; [`Journal::finish`] leaves the folder holding only spare files, for the
//! owner to recycle for a later turn (creating and deleting inodes is dear on a file
//! system without a journal; docs/decisions/turn-recycled-outbox-folders.md); the frames of a file
//! are answered together (the owner applies
//! a batch in one transaction, and `prompt.open` and `child.reserve`, answered late, get files
//! of their own). [`Journal::open`] reloads every frame of the files left, so a restarted
//! sender resends the same frames with the same sequences and payloads (one reloaded between
//! two receipts of a file may send an answered frame again, which the owner answers with its
//! stored receipt, SPEC section 4). This module is plain,
//! synchronous file IO, the bottom layer of the crate: the owner pipe above it calls it one frame
//! at a time and carries the frames.

use std::collections::BTreeMap;
use std::fs::{self, DirBuilder, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use drover_platform::OPEN_NO_FOLLOW;
use drover_protocol::worker::{
    Operation, PersistFrame, Scope, WorkerFrame, MAX_FRAME_BYTES, OUTBOX_SPARES_MAX,
    OUTBOX_SPARE_PREFIX,
};
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
    /// The path the folder's files are reached by: `/proc/self/fd/<n>` of `_held`, so the
    /// outbox stays writable when the home is moved or renamed under a running worker (the
    /// owner then drains: the turn must still settle). The folder's own path where `/proc` is
    /// not mounted.
    at: PathBuf,
    /// The folder as named at [`Journal::open`] (for [`Journal::dir`] and logs).
    dir: PathBuf,
    /// The folder, held open for as long as the journal lives.
    _held: Option<fs::File>,
    scope: Scope,
    next_sequence: u64,
    /// Every frame not answered yet, held ones included.
    pending: BTreeMap<u64, PersistFrame>,
    /// Held frames ([`Journal::hold`]), not written yet: the next recorded frame's file holds
    /// them.
    held: Vec<u64>,
    /// The file of each written, unanswered frame, by its first sequence.
    file_of: BTreeMap<u64, u64>,
    /// How many frames of each file (by its first sequence) are unanswered.
    left_in: BTreeMap<u64, usize>,
    /// Empty spare files in the folder, the next write's first.
    spares: Vec<PathBuf>,
    /// The number of the next spare file's name.
    next_spare: u64,
}

/// Shows no frame and no secret, so a logged journal never leaks the execution secret.
impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("dir", &self.dir)
            .field("execution_id", &self.scope.execution_id)
            .field("next_sequence", &self.next_sequence)
            .field("unacknowledged", &self.pending.keys().collect::<Vec<_>>())
            .field("held", &self.held)
            .finish()
    }
}

impl Journal {
    /// Opens (creating, 0700) the outbox `dir` for `scope` and reloads the frames left in it.
    /// The next sequence is one past the highest found (1 for an empty outbox). Leftover
    /// temporary files of an interrupted write are removed; spare files (a recycled folder's)
    /// are kept for the next writes.
    pub fn open(dir: impl Into<PathBuf>, scope: Scope) -> Result<Journal, JournalError> {
        let dir = dir.into();
        // A worker's outbox is new at its start: made here, it has nothing to reload.
        let created = match DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
            Err(_) => {
                DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(&dir)
                    .map_err(|e| JournalError::io(&dir, e))?;
                true
            }
        };
        // `mode` is cut by the umask, and an existing folder keeps its own: make it private
        // and usable either way.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))
            .map_err(|e| JournalError::io(&dir, e))?;
        let held = fs::File::open(&dir).ok();
        let via_fd = held
            .as_ref()
            .map(|f| PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd())))
            .filter(|p| p.is_dir());
        let mut journal = Journal {
            at: via_fd.unwrap_or_else(|| dir.clone()),
            dir,
            _held: held,
            scope,
            next_sequence: 1,
            pending: BTreeMap::new(),
            held: Vec::new(),
            file_of: BTreeMap::new(),
            left_in: BTreeMap::new(),
            spares: Vec::new(),
            next_spare: 0,
        };
        if !created {
            journal.reload()?;
        }
        Ok(journal)
    }

    /// Loads the frames of every file in the directory (see [`Journal::open`]).
    fn reload(&mut self) -> Result<(), JournalError> {
        let dir = self.at.clone();
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
            if let Some(number) = name.strip_prefix(OUTBOX_SPARE_PREFIX) {
                // A spare file holds no frame (one being filled when a worker died holds part
                // of one that was never sent): reused by the next write.
                if let Ok(n) = number.parse::<u64>() {
                    self.next_spare = self.next_spare.max(n + 1);
                }
                self.spares.push(path);
                continue;
            }
            let Some(first) = parse_file_name(&name) else {
                tracing::warn!(path = %path.display(), "ignoring a foreign file in the outbox");
                continue;
            };
            let frames = load_frames(&path, self.scope.secret.expose())?;
            for (offset, frame) in (0u64..).zip(frames) {
                if frame.sequence != first + offset || frame.execution_id != self.scope.execution_id
                {
                    return Err(JournalError::Corrupt {
                        path,
                        detail: format!(
                            "holds sequence {} of execution {:?} at place {}",
                            frame.sequence,
                            frame.execution_id,
                            offset + 1
                        ),
                    });
                }
                self.file_of.insert(frame.sequence, first);
                *self.left_in.entry(first).or_default() += 1;
                self.pending.insert(frame.sequence, frame);
            }
        }
        self.next_sequence = self.pending.keys().next_back().map_or(1, |last| last + 1);
        Ok(())
    }

    /// The outbox directory, as named when it was opened.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The sequence the next [`Journal::record`] will use.
    pub fn next_sequence(&self) -> u64 {
        self.next_sequence
    }

    /// Builds the frame for `operation` with the next sequence and writes it, with the frames
    /// held before it, as one file (temp file, then rename, so a file is whole or absent).
    /// Only then may they be sent. A `prompt.open` or `child.reserve`, which travels alone and
    /// is answered late, gets a file of its own after one for the held frames, so the frames
    /// of a file are answered together.
    ///
    /// Errors: [`JournalError::FrameTooLarge`] when the wire line would exceed
    /// [`MAX_FRAME_BYTES`] (nothing written, sequence not used); [`JournalError::Io`] (the
    /// frame not written, its sequence not used).
    pub fn record(&mut self, operation: Operation) -> Result<PersistFrame, JournalError> {
        let frame = self.next_frame(operation)?;
        let mut held = std::mem::take(&mut self.held);
        if !frame.batchable() && !held.is_empty() {
            if let Err(e) = self.write_file(&held, None) {
                self.held = held;
                return Err(e);
            }
            held.clear();
        }
        if let Err(e) = self.write_file(&held, Some(&frame)) {
            self.held = held;
            return Err(e);
        }
        self.next_sequence += 1;
        self.pending.insert(frame.sequence, frame.clone());
        Ok(frame)
    }

    /// Writes the pending frames `held` and then `last` as one file named by the first
    /// sequence (nothing when there is no frame).
    fn write_file(
        &mut self,
        held: &[u64],
        last: Option<&PersistFrame>,
    ) -> Result<(), JournalError> {
        let mut frames: Vec<&PersistFrame> =
            held.iter().filter_map(|s| self.pending.get(s)).collect();
        frames.extend(last);
        let Some(first) = frames.first().map(|f| f.sequence) else {
            return Ok(());
        };
        let path = self.frame_path(first);
        let body = stored_body(&frames).map_err(|e| JournalError::Corrupt {
            path: path.clone(),
            detail: format!("cannot serialise: {e}"),
        })?;
        let sequences: Vec<u64> = frames.iter().map(|f| f.sequence).collect();
        // Filled under a name that is not a frame's, then renamed into place: a file is whole
        // or absent. A spare file is filled rather than a new one created.
        let filled = match self.spares.pop() {
            Some(spare) => match fill_spare(&spare, &body) {
                Ok(()) => Some(spare),
                Err(e) => {
                    tracing::debug!(path = %spare.display(), error = %e, "spare outbox file unusable");
                    let _ = fs::remove_file(&spare);
                    None
                }
            },
            None => None,
        };
        let from = match filled {
            Some(spare) => spare,
            None => {
                let tmp = path.with_extension("json.tmp");
                write_private(&tmp, &body)?;
                tmp
            }
        };
        fs::rename(&from, &path).map_err(|e| JournalError::io(&path, e))?;
        self.left_in.insert(first, sequences.len());
        for sequence in sequences {
            self.file_of.insert(sequence, first);
        }
        Ok(())
    }

    /// Builds the frame for `operation` with the next sequence and holds it in memory: the
    /// next [`Journal::record`] writes it, in one file with that frame, and it may not be sent
    /// before. A worker killed meanwhile loses it with its turn, which is `unknown` then.
    ///
    /// Errors: [`JournalError::FrameTooLarge`] (sequence not used).
    pub fn hold(&mut self, operation: Operation) -> Result<PersistFrame, JournalError> {
        let frame = self.next_frame(operation)?;
        self.next_sequence += 1;
        self.held.push(frame.sequence);
        self.pending.insert(frame.sequence, frame.clone());
        Ok(frame)
    }

    /// The frame `operation` would be with the next sequence; refused when its wire line would
    /// exceed [`MAX_FRAME_BYTES`].
    fn next_frame(&self, operation: Operation) -> Result<PersistFrame, JournalError> {
        let frame = PersistFrame {
            epoch: self.scope.epoch,
            execution_id: self.scope.execution_id.clone(),
            generation: self.scope.generation,
            sequence: self.next_sequence,
            operation,
            secret: self.scope.secret.clone(),
        };
        let bytes = wire_line(&frame).len();
        if bytes > MAX_FRAME_BYTES {
            return Err(JournalError::FrameTooLarge {
                operation: frame.operation.name().to_string(),
                bytes,
            });
        }
        Ok(frame)
    }

    /// The owner answered `sequence` (receipt or refusal): forget it, and delete its file once
    /// every frame in that file is answered. Unknown or already acknowledged sequences are not
    /// an error. Returns whether the frame was pending.
    pub fn acknowledge(&mut self, sequence: u64) -> Result<bool, JournalError> {
        if self.held.contains(&sequence) {
            // Never sent, so this is no answer to it: it stays held (dropping it would leave a
            // gap in the batch it goes with).
            return Ok(false);
        }
        let was_pending = self.pending.remove(&sequence).is_some();
        let Some(first) = self.file_of.remove(&sequence) else {
            return Ok(was_pending);
        };
        let left = self.left_in.entry(first).or_default();
        *left = left.saturating_sub(1);
        if *left > 0 {
            return Ok(was_pending);
        }
        self.left_in.remove(&first);
        self.retire_file(first)?;
        Ok(was_pending)
    }

    /// The file named by `first` is answered: emptied and kept as a spare file, or deleted
    /// when there are enough spares.
    fn retire_file(&mut self, first: u64) -> Result<(), JournalError> {
        let path = self.frame_path(first);
        if self.spares.len() < OUTBOX_SPARES_MAX {
            let spare = self
                .at
                .join(format!("{OUTBOX_SPARE_PREFIX}{}", self.next_spare));
            // Emptied first: a spare file holds no frame, and a rename that fails leaves a
            // frame file that is empty, never one that looks unanswered.
            let emptied = OpenOptions::new()
                .write(true)
                .truncate(true)
                .custom_flags(OPEN_NO_FOLLOW)
                .open(&path);
            match emptied.and_then(|_| fs::rename(&path, &spare)) {
                Ok(()) => {
                    self.next_spare += 1;
                    self.spares.push(spare);
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(e) => {
                    tracing::debug!(path = %path.display(), error = %e, "cannot keep an answered frame file as a spare");
                }
            }
        }
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(JournalError::io(&path, e)),
        }
    }

    /// The execution was adopted by an owner of runtime epoch `epoch` (a daemon handoff): frames
    /// built from now on carry it, and so does every unanswered one in memory, held or written,
    /// for it is sent or resent from memory. Files already written keep the epoch they were
    /// written with: only a reload reads them, and a worker never reloads its own outbox.
    pub fn set_epoch(&mut self, epoch: u64) {
        self.scope.epoch = epoch;
        for frame in self.pending.values_mut() {
            frame.epoch = epoch;
        }
    }

    /// The epoch frames are built with ([`Journal::set_epoch`] changes it).
    pub fn epoch(&self) -> u64 {
        self.scope.epoch
    }

    /// The unacknowledged frame with this `sequence`, if any.
    pub fn frame(&self, sequence: u64) -> Option<&PersistFrame> {
        self.pending.get(&sequence)
    }

    /// The frames not yet acknowledged, in sequence order.
    pub fn unacknowledged(&self) -> Vec<PersistFrame> {
        self.pending.values().cloned().collect()
    }

    /// Ends the outbox: every frame file left is retired like an answered one, so the folder
    /// holds only spare files, for the owner to recycle (or remove) once this worker is reaped.
    /// Call once the owner acknowledged `execution.finish`: the execution is terminal then and
    /// the owner answers nothing more of it, so a frame still listed (a `prompt.open` whose
    /// answer was abandoned by a stop) is moot.
    pub fn finish(mut self) -> Result<(), JournalError> {
        if !self.pending.is_empty() {
            tracing::debug!(
                left = self.pending.len(),
                "ending the outbox with frames the owner settled by execution.finish"
            );
        }
        let files: Vec<u64> = std::mem::take(&mut self.left_in).into_keys().collect();
        for first in files {
            self.retire_file(first)?;
        }
        Ok(())
    }

    fn frame_path(&self, sequence: u64) -> PathBuf {
        self.at
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

/// The file body of `frames` (one or a batch): each frame without its `secret`, an object
/// for one frame, an array for several.
fn stored_body(frames: &[&PersistFrame]) -> Result<Vec<u8>, serde_json::Error> {
    let mut stored = Vec::with_capacity(frames.len());
    for frame in frames {
        let mut value = serde_json::to_value(frame)?;
        if let Some(obj) = value.as_object_mut() {
            obj.remove("secret");
        }
        stored.push(value);
    }
    match <[Value; 1]>::try_from(stored) {
        Ok([one]) => serde_json::to_vec(&one),
        Err(batch) => serde_json::to_vec(&batch),
    }
}

/// Reads a frame file (one frame or a batch) and gives each frame `secret` back. A file that
/// holds a secret (written before frames were stored without one) must hold this one:
/// anything else belongs to another execution.
fn load_frames(path: &Path, secret: &str) -> Result<Vec<PersistFrame>, JournalError> {
    let corrupt = |detail: String| JournalError::Corrupt {
        path: path.to_path_buf(),
        detail,
    };
    let body = fs::read(path).map_err(|e| JournalError::io(path, e))?;
    let value: Value = serde_json::from_slice(&body).map_err(|e| corrupt(e.to_string()))?;
    let values = match value {
        Value::Array(values) if !values.is_empty() => values,
        Value::Array(_) => return Err(corrupt("an empty batch".to_string())),
        one => vec![one],
    };
    let mut frames = Vec::with_capacity(values.len());
    for mut value in values {
        let obj = value
            .as_object_mut()
            .ok_or_else(|| corrupt("not a JSON object".to_string()))?;
        match obj.get("secret").and_then(Value::as_str) {
            None => {}
            Some(stored) if stored == secret => {}
            Some(_) => return Err(corrupt("holds another execution's secret".to_string())),
        }
        obj.insert("secret".into(), Value::String(secret.to_string()));
        frames.push(serde_json::from_value(value).map_err(|e| corrupt(e.to_string()))?);
    }
    Ok(frames)
}

/// Writes `body` into the spare file at `path` (made by this journal's kind, 0600, emptied
/// when it was retired). A symbolic link there is not followed: the open fails; a spare that
/// is not empty is refused (the caller writes a new file).
///
/// The spare is not opened with `O_TRUNC`: on ext4 a truncation to size 0 marks the file
/// for `auto_da_alloc`, so the `close` after the write would start writeback of a frame file
/// that is emptied again within milliseconds (a disk write per persist, competing with the
/// ledger's fsyncs).
fn fill_spare(path: &Path, body: &[u8]) -> io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .custom_flags(OPEN_NO_FOLLOW)
        .open(path)?;
    if file.metadata()?.len() != 0 {
        return Err(io::Error::other("the spare file is not empty"));
    }
    file.write_all(body)
}

fn write_private(path: &Path, body: &[u8]) -> Result<(), JournalError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(OPEN_NO_FOLLOW)
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

    /// Holds `usage.add` (sequence 1) and `transcript.append` (2), as a turn's end does.
    fn hold_two(journal: &mut Journal) -> (PersistFrame, PersistFrame) {
        let usage = journal
            .hold(Operation::read("usage.add", json!({"n": 1})))
            .expect("hold");
        let message = journal
            .hold(Operation::read("transcript.append", json!({"n": 2})))
            .expect("hold");
        (usage, message)
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
            .record(Operation::read("usage.add", json!({"n": 1})))
            .expect("record");
        let second = journal
            .record(Operation::read("transcript.append", json!({"n": 2})))
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
            .record(Operation::read("usage.add", json!({"n": 1})))
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
    fn acknowledge_retires_and_unacknowledged_lists_the_rest_in_order() {
        let (_home, dir, mut journal) = fresh();
        for n in 1..=3 {
            journal
                .record(Operation::read("usage.add", json!({"n": n})))
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
                    .record(Operation::read("usage.add", json!({"n": n})))
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
            .record(Operation::read("execution.finish", json!({})))
            .expect("record");
        assert_eq!(next.sequence, 4);
    }

    #[test]
    fn held_frames_are_written_with_the_next_record_as_one_file_retired_when_all_are_answered() {
        let (_home, dir, mut journal) = fresh();
        let (usage, message) = hold_two(&mut journal);
        assert_eq!((usage.sequence, message.sequence), (1, 2));
        assert_eq!(
            fs::read_dir(&dir).expect("dir").count(),
            0,
            "a held frame is not written (nor sent) before the next record"
        );
        let finish = journal
            .record(Operation::read("execution.finish", json!({"n": 3})))
            .expect("record");
        let file = dir.join("00000000000000000001.json");
        let names: Vec<_> = fs::read_dir(&dir)
            .expect("dir")
            .map(|e| e.expect("entry").path())
            .collect();
        assert_eq!(names, vec![file.clone()], "one file for the batch");
        let text = fs::read_to_string(&file).expect("read");
        assert!(!text.contains("sekret"), "the secret is on disk: {text}");
        assert_eq!(
            serde_json::from_str::<Value>(&text)
                .expect("json")
                .as_array()
                .map(Vec::len),
            Some(3)
        );

        // A restarted sender reloads the batch, secrets restored, and continues after it.
        let reopened = Journal::open(&dir, scope()).expect("reopen");
        assert_eq!(
            reopened.unacknowledged(),
            vec![usage.clone(), message.clone(), finish.clone()]
        );
        assert_eq!(reopened.next_sequence(), 4);
        drop(reopened);

        assert!(journal.acknowledge(1).expect("ack"));
        assert!(journal.acknowledge(3).expect("ack"));
        assert!(file.exists(), "sequence 2 of the file is not answered yet");
        assert!(journal.acknowledge(2).expect("ack"));
        assert!(!file.exists());
        journal.finish().expect("finish");
        assert_eq!(
            self::names(&dir),
            [".spare-0"],
            "answered, the file is a spare"
        );
    }

    /// A `prompt.open` is answered late: the held frames before it get a file of their own,
    /// so answering them deletes their file and a reload sees only the prompt.
    #[test]
    fn a_prompt_open_after_held_frames_gets_a_file_of_its_own() {
        let (_home, dir, mut journal) = fresh();
        hold_two(&mut journal);
        let open = journal
            .record(Operation::read("prompt.open", json!({"n": 3})))
            .expect("record");
        let mut names: Vec<_> = fs::read_dir(&dir)
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["00000000000000000001.json", "00000000000000000003.json"]
        );
        assert!(journal.acknowledge(1).expect("ack"));
        assert!(journal.acknowledge(2).expect("ack"));
        drop(journal);
        let reopened = Journal::open(&dir, scope()).expect("reopen");
        assert_eq!(reopened.unacknowledged(), vec![open]);
    }

    /// An answer to a held frame (never sent) is no answer: the frame stays held, and the batch
    /// it is written in has no gap.
    #[test]
    fn an_answer_to_a_held_frame_is_ignored() {
        let (_home, dir, mut journal) = fresh();
        hold_two(&mut journal);
        assert!(!journal.acknowledge(2).expect("ack of a held frame"));
        journal
            .record(Operation::read("execution.finish", json!({"n": 3})))
            .expect("record");
        drop(journal);
        let reopened = Journal::open(&dir, scope()).expect("reopen");
        let left: Vec<u64> = reopened
            .unacknowledged()
            .iter()
            .map(|f| f.sequence)
            .collect();
        assert_eq!(left, [1, 2, 3]);
    }

    #[test]
    fn a_batch_file_out_of_sequence_is_corrupt() {
        let (_home, dir, mut journal) = fresh();
        journal
            .hold(Operation::read("usage.add", json!({"n": 1})))
            .expect("hold");
        journal
            .record(Operation::read("execution.finish", json!({"n": 2})))
            .expect("record");
        drop(journal);
        let file = dir.join("00000000000000000001.json");
        let mut batch: Value =
            serde_json::from_slice(&fs::read(&file).expect("read")).expect("json");
        batch[1]["sequence"] = json!(5);
        fs::write(&file, batch.to_string()).expect("write");
        let err = Journal::open(&dir, scope()).expect_err("out of sequence");
        assert!(matches!(err, JournalError::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains("sequence 5"), "{err}");
    }

    #[test]
    fn oversize_frame_is_refused_without_using_a_sequence() {
        let (_home, dir, mut journal) = fresh();
        let big = "x".repeat(MAX_FRAME_BYTES);
        let err = journal
            .record(Operation::read("transcript.append", json!({ "text": big })))
            .expect_err("too large");
        assert!(matches!(err, JournalError::FrameTooLarge { .. }), "{err}");
        assert!(err.to_string().contains("transcript.append"), "{err}");
        assert_eq!(journal.next_sequence(), 1);
        assert!(journal.unacknowledged().is_empty());
        assert_eq!(fs::read_dir(&dir).expect("dir").count(), 0);
    }

    /// The names in `dir`, sorted.
    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// Lean worker start: an answered file becomes an empty spare file, the next write fills it instead
    /// of creating a file (the same inode), and `finish` leaves only spare files, also of the
    /// frames left unanswered.
    #[test]
    fn answered_files_become_spare_files_that_later_writes_reuse() {
        use std::os::unix::fs::MetadataExt;
        let (_home, dir, mut journal) = fresh();
        journal
            .record(Operation::read("usage.add", json!({"n": 1})))
            .expect("record");
        let inode = fs::metadata(journal.frame_path(1)).expect("file").ino();
        journal.acknowledge(1).expect("ack");
        assert_eq!(names(&dir), [".spare-0"]);
        assert_eq!(fs::read(dir.join(".spare-0")).expect("spare"), b"");

        let second = journal
            .record(Operation::read("usage.add", json!({"n": 2})))
            .expect("record");
        assert_eq!(names(&dir), ["00000000000000000002.json"]);
        let path = journal.frame_path(2);
        assert_eq!(fs::metadata(&path).expect("file").ino(), inode);
        assert_eq!(load_frames(&path, "sekret").expect("load"), [second]);

        journal
            .record(Operation::read("prompt.open", json!({"n": 3})))
            .expect("record");
        journal.finish().expect("finish");
        assert_eq!(names(&dir), [".spare-1", ".spare-2"]);
    }

    /// A symbolic link planted as a spare file is not written through: the write makes a
    /// file of its own and the link is dropped.
    #[test]
    fn a_spare_that_is_a_symbolic_link_is_not_followed() {
        let (home, dir, journal) = fresh();
        drop(journal);
        let target = home.path().join("elsewhere");
        fs::write(&target, b"keep me").expect("target");
        std::os::unix::fs::symlink(&target, dir.join(".spare-0")).expect("symlink");
        let mut journal = Journal::open(&dir, scope()).expect("open");
        let frame = journal
            .record(Operation::read("usage.add", json!({"n": 1})))
            .expect("record");
        assert_eq!(fs::read(&target).expect("target"), b"keep me");
        assert_eq!(
            load_frames(&journal.frame_path(1), "sekret").expect("load"),
            [frame]
        );
        assert_eq!(self::names(&dir), ["00000000000000000001.json"]);
    }

    /// A spare file that is not empty (written by someone else) is not filled, since it is
    /// not truncated: the write makes a file of its own and the frame is read back whole.
    #[test]
    fn a_spare_that_is_not_empty_is_not_filled() {
        let (_home, dir, journal) = fresh();
        drop(journal);
        fs::write(dir.join(".spare-0"), "x".repeat(4096)).expect("spare");
        let mut journal = Journal::open(&dir, scope()).expect("open");
        let frame = journal
            .record(Operation::read("usage.add", json!({"n": 1})))
            .expect("record");
        assert_eq!(
            load_frames(&journal.frame_path(1), "sekret").expect("load"),
            [frame]
        );
        assert_eq!(self::names(&dir), ["00000000000000000001.json"]);
    }

    /// A recycled folder's spare files are reused, never read as frames; past
    /// `OUTBOX_SPARES_MAX` an answered file is deleted.
    #[test]
    fn a_recycled_folder_is_reused_and_keeps_a_bounded_number_of_spares() {
        let (_home, dir, journal) = fresh();
        drop(journal);
        for n in [3, 7] {
            fs::write(
                dir.join(format!(".spare-{n}")),
                b"part of a frame never sent",
            )
            .expect("spare");
        }
        let mut journal = Journal::open(&dir, scope()).expect("open");
        assert!(journal.unacknowledged().is_empty());
        assert_eq!(journal.next_sequence(), 1);
        for n in 1..=8 {
            journal
                .record(Operation::read("usage.add", json!({"n": n})))
                .expect("record");
        }
        assert_eq!(names(&dir).len(), 8);
        for n in 1..=8 {
            journal.acknowledge(n).expect("ack");
        }
        let left = names(&dir);
        assert_eq!(left.len(), OUTBOX_SPARES_MAX, "{left:?}");
        assert!(
            left.iter().all(|n| n.starts_with(OUTBOX_SPARE_PREFIX)),
            "{left:?}"
        );
        // Numbered past the ones found, so no rename replaces (deletes) another spare.
        assert!(left.contains(&".spare-8".to_string()), "{left:?}");
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
