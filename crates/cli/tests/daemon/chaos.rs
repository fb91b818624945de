//! Chaos test (SPEC sections 0, 2 to 4): many scripted turns on several sessions while
//! workers and the owner are SIGKILLed, or the owner is stopped gracefully, at random points.
//! Real `drover` daemon and worker processes, real SQLite, real signals, a loopback model.
//!
//! Each client task owns a few sessions (one at a time; it moves to a new one after
//! [`ROTATE_AFTER`] inputs so histories stay small) and submits inputs whose text is a unique
//! token. The model answers a token with a `terminal` call that appends the token to a
//! side-effect file (sometimes sleeping before or after, so kills land mid-tool, and now and
//! then ignoring SIGTERM past the drain grace), then with a text answer. Meanwhile the chaos
//! loop SIGKILLs workers (at random, mid-tool, or while the model holds a response at a
//! [`Gate`]), the worker template and its spares (alone or with the running workers), SIGKILLs
//! the owner (at random, mid-tool, while a submit waits for its answer, in
//! the middle of a graceful stop) and restarts it, or stops it gracefully and restarts it.
//! Clients reconnect (re-reading `daemon.json`), re-submit inputs whose answer never came (same
//! `input_id` and text: idempotent, G1), resolve `unknown` admissions, and now and then cancel
//! a queued input, interrupt the running turn, or drop their connection (G3).
//!
//! Then the chaos stops, every client resolves what is unknown and waits (bounded) for its
//! queues to drain, and the ledger, the side-effect file and the model's request log are
//! checked: no acknowledged input lost, no started work run twice, no terminal outcome changed,
//! no session stuck, no lease left, stored events and results in agreement with the ledger.
//!
//! `cargo test` runs the fixed seeds [`SEEDS`] one after the other, [`SEED_SECS`] of chaos
//! each, so every run (CI included) takes the same random decisions. `DROVER_CHAOS_SEED` runs
//! one seed instead (a failure's seed reproduces it: process timing is not replayed, so a
//! replay takes the same decisions, not necessarily the same interleavings);
//! `DROVER_CHAOS_SECS` sets the length of the chaos phase, and alone it is the long mode: one
//! run on a new seed taken from the clock. The seed is printed at the start and is in every
//! failure message; on failure the ledger, the logs, the owners' stderr and the side-effect
//! file are copied to `$TMPDIR/drover-chaos-<seed>/`.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once};
use std::time::{Duration, Instant};

use crate::common::bin;
use drover_test_support::harness::{
    children_of, db_rows, db_value, open_files, pid_alive, pids, rss_kib, signal, zombie_children,
    Client, Daemon, TestHome,
};
use drover_test_support::{alone, Gate, MockModel, Reply};
use nix::sys::signal::Signal;
use serde_json::{json, Value};

/// Client tasks, each with its own connection and sessions.
const CLIENTS: usize = 3;
/// A client submits a new input only while fewer than this many of its current session's
/// inputs are not known to be terminal.
const MAX_OUTSTANDING: usize = 4;
/// A client moves to a new session after this many inputs, so histories stay small.
const ROTATE_AFTER: usize = 20;
/// Bound of the final drain (resolve unknowns, wait for every queue to empty).
const DRAIN_BOUND: Duration = Duration::from_secs(60);
/// The seeds `cargo test` runs (both a streaming and a non-streaming model among them).
const SEEDS: [u64; 4] = [1, 2, 7, 42];
/// Length of each run's chaos phase unless `DROVER_CHAOS_SECS` says otherwise, in seconds.
const SEED_SECS: f64 = 25.0;

// ---------------------------------------------------------------------------------------------
// Seed, failure messages, artifacts

struct Run {
    seed: u64,
    home: PathBuf,
    side_effects: PathBuf,
    stderr_log: PathBuf,
}

/// The run under way (one seed at a time), for failure messages and the panic hook.
static RUN: Mutex<Option<Run>> = Mutex::new(None);

fn replay_note() -> String {
    match lock(&RUN).as_ref() {
        Some(r) => seed_note(r.seed),
        None => "[chaos seed not chosen yet]".to_string(),
    }
}

fn seed_note(seed: u64) -> String {
    format!("[chaos seed {seed}; replay with DROVER_CHAOS_SEED={seed}]")
}

macro_rules! fail {
    ($($arg:tt)*) => {
        panic!("{} {}", replay_note(), format!($($arg)*))
    };
}

/// On any panic, copies the ledger, the logs and the side-effect file next to the seed and
/// says where, before the default hook prints the message.
fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let saved = lock(&RUN).as_ref().map(|run| {
                let keep = std::env::temp_dir().join(format!("drover-chaos-{}", run.seed));
                let result = save_artifacts(run, &keep);
                (run.seed, keep, result)
            });
            match saved {
                Some((seed, keep, Ok(()))) => eprintln!(
                    "{} ledger, logs, owner stderr and side effects copied to {}",
                    seed_note(seed),
                    keep.display()
                ),
                Some((seed, _, Err(e))) => {
                    eprintln!("{} could not save artifacts: {e}", seed_note(seed))
                }
                None => {}
            }
            default(info);
        }));
    });
}

fn save_artifacts(run: &Run, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for name in ["state.db", "state.db-wal", "state.db-shm"] {
        let from = run.home.join(name);
        if from.exists() {
            std::fs::copy(&from, to.join(name))?;
        }
    }
    for (from, name) in [
        (&run.side_effects, "side_effects"),
        (&run.stderr_log, "daemon.stderr"),
    ] {
        if from.exists() {
            std::fs::copy(from, to.join(name))?;
        }
    }
    copy_dir(&run.home.join("logs"), &to.join("logs"))
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// A small seeded PRNG (splitmix64), one stream per task so each replays on its own.

struct Rng(u64);

impl Rng {
    fn new(seed: u64, stream: u64) -> Rng {
        let mut r = Rng(seed ^ stream.wrapping_add(1).wrapping_mul(0xD1B5_4A32_D192_ED03));
        r.next();
        r
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// A duration of 0 to `max` ms.
    fn millis(&mut self, max: u64) -> Duration {
        Duration::from_millis(self.below(max + 1))
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        items.get(self.below(items.len() as u64) as usize)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// ---------------------------------------------------------------------------------------------
// What the clients observed

/// One input: its token is both its `input_id` and its text.
struct Input {
    session: String,
    /// From the first receipt that answered a submit of it.
    admission_id: Option<String>,
    attempts: u32,
    /// The admission a snapshot showed for it while no submit of it had been answered.
    seen_pending: Option<String>,
}

#[derive(Default, Debug)]
struct ClientStats {
    submitted: u64,
    resubmits: u64,
    /// Inputs whose submit answer was lost although the admission was committed (a snapshot
    /// showed it, or the re-submit's receipt was past `queued`): the re-submit must return
    /// that same admission (G1).
    answers_lost_but_admitted: u64,
    draining_refusals: u64,
    resolves: u64,
    cancels: u64,
    cancel_races: u64,
    interrupts: u64,
    interrupt_races: u64,
    disconnects: u64,
    drops: u64,
    sessions: u64,
    /// `storage_unavailable` answers during disk-full windows.
    storage_refusals: u64,
}

#[derive(Default)]
struct Book {
    inputs: BTreeMap<String, Input>,
    /// admission id -> (the first terminal outcome seen, where it was seen)
    terminal: HashMap<String, (String, String)>,
    /// Admissions seen `unknown` at least once.
    ever_unknown: BTreeSet<String>,
    /// Broken guarantees seen during the run.
    violations: Vec<String>,
    stats: ClientStats,
}

impl Book {
    fn violation(&mut self, msg: String) {
        eprintln!("{} VIOLATION: {msg}", replay_note());
        self.violations.push(msg);
    }

    fn observe_terminal(&mut self, admission_id: &str, outcome: &str, source: &str) {
        match self.terminal.get(admission_id) {
            Some((first, seen)) if first != outcome => {
                let msg = format!(
                    "admission {admission_id} was terminal/{first} (seen in {seen}) and later \
                     terminal/{outcome} (in {source})"
                );
                self.violation(msg);
            }
            Some(_) => {}
            None => {
                self.terminal.insert(
                    admission_id.to_string(),
                    (outcome.to_string(), source.to_string()),
                );
            }
        }
    }

    fn observe_receipt(&mut self, r: &Value, source: &str) {
        let aid = r["admission_id"].as_str().unwrap_or_default();
        match r["status"].as_str() {
            Some("terminal") => match r["outcome"].as_str() {
                Some(outcome) => self.observe_terminal(aid, outcome, source),
                None => self.violation(format!("terminal receipt without outcome ({source}): {r}")),
            },
            Some("unknown") => {
                self.ever_unknown.insert(aid.to_string());
            }
            Some("queued" | "started") => {}
            _ => self.violation(format!("receipt with a bad status ({source}): {r}")),
        }
        if r["status"] != "terminal" && !r["outcome"].is_null() {
            self.violation(format!(
                "non-terminal receipt with an outcome ({source}): {r}"
            ));
        }
    }

    /// A receipt answering a submit of `token`.
    fn observe_ack(&mut self, token: &str, r: &Value) {
        let aid = r["admission_id"].as_str().unwrap_or_default().to_string();
        let input = self
            .inputs
            .get_mut(token)
            .expect("submitted inputs are recorded");
        let mut bad = None;
        match (&input.admission_id, &input.seen_pending) {
            (Some(first), _) if *first != aid => {
                bad = Some(format!(
                    "G1: input_id {token} was acknowledged as admission {first}, then as {aid}"
                ));
            }
            (Some(_), _) => {}
            (None, seen) => {
                let admitted_before =
                    seen.is_some() || (input.attempts > 1 && r["status"] != "queued");
                if let Some(seen) = seen.as_ref().filter(|s| **s != aid) {
                    bad = Some(format!(
                        "G1: a snapshot showed input_id {token} as admission {seen}, its \
                         re-submit answered {aid}"
                    ));
                }
                input.admission_id = Some(aid);
                if admitted_before {
                    self.stats.answers_lost_but_admitted += 1;
                }
            }
        }
        if let Some(msg) = bad {
            self.violation(msg);
        }
        self.observe_receipt(r, "prompt.submit");
    }

    fn observe_event(&mut self, e: &Value) {
        let p = &e["payload"];
        let aid = p["admission_id"].as_str().unwrap_or_default();
        let kind = e["type"].as_str().unwrap_or_default();
        match kind {
            "turn.settled" | "message.complete" => match p["outcome"].as_str() {
                Some("unknown") => {
                    self.ever_unknown.insert(aid.to_string());
                }
                Some(outcome) => self.observe_terminal(aid, outcome, kind),
                None => self.violation(format!("{kind} without outcome: {e}")),
            },
            "admission.updated" => match p["status"].as_str() {
                Some("terminal") => match p["outcome"].as_str() {
                    Some(outcome) => self.observe_terminal(aid, outcome, kind),
                    None => self.violation(format!("terminal {kind} without outcome: {e}")),
                },
                Some("unknown") => {
                    self.ever_unknown.insert(aid.to_string());
                }
                _ => {}
            },
            _ => {}
        }
    }

    /// Tokens of `session` submitted but never acknowledged.
    fn unacked(&self, session: &str) -> Vec<String> {
        self.inputs
            .iter()
            .filter(|(_, i)| i.session == session && i.admission_id.is_none())
            .map(|(t, _)| t.clone())
            .collect()
    }

    /// Acknowledged admissions of `session` not yet seen terminal.
    fn open_admissions(&self, session: &str) -> Vec<String> {
        self.inputs
            .values()
            .filter(|i| i.session == session)
            .filter_map(|i| i.admission_id.clone())
            .filter(|a| !self.terminal.contains_key(a))
            .collect()
    }
}

struct Shared {
    home: PathBuf,
    cwd: PathBuf,
    book: Mutex<Book>,
    /// Set when the chaos is over: clients stop submitting and drain.
    stop: AtomicBool,
    /// `prompt.submit` calls waiting for their answer, so the chaos can kill the owner then.
    submitting: AtomicUsize,
    /// Disk-full windows: while one is open (and for [`DISK_FULL_SETTLE`] after), a
    /// `storage_unavailable` answer is the truth, not a violation, and is not an answer.
    disk_full: Mutex<DiskFull>,
}

#[derive(Default)]
struct DiskFull {
    open: bool,
    closed_at: Option<Instant>,
}

/// How long after a disk-full window `storage_unavailable` answers are still expected (calls
/// that were in flight as it closed).
const DISK_FULL_SETTLE: Duration = Duration::from_secs(3);

impl Shared {
    fn book(&self) -> MutexGuard<'_, Book> {
        lock(&self.book)
    }

    fn disk_was_full(&self) -> bool {
        let d = lock(&self.disk_full);
        d.open || d.closed_at.is_some_and(|t| t.elapsed() < DISK_FULL_SETTLE)
    }
}

// ---------------------------------------------------------------------------------------------
// A client task

enum Rpc {
    Ok(Value),
    Err(Value),
    /// The connection broke before the answer.
    Lost,
}

fn aid_of(v: &Value) -> String {
    v["admission_id"].as_str().unwrap_or_default().to_string()
}

fn reason(e: &Value) -> &str {
    e["data"]["reason"].as_str().unwrap_or_default()
}

struct Runner {
    idx: usize,
    shared: Arc<Shared>,
    rng: Rng,
    conn: Option<Client>,
    /// Sessions the current connection is attached to.
    attached: BTreeSet<String>,
    /// Every session this client created, the current one last.
    sessions: Vec<String>,
    /// Inputs submitted to the current session.
    submitted_here: usize,
    next_token: usize,
    /// Queued admissions of the current session, from the latest snapshot.
    queued: Vec<String>,
}

impl Runner {
    fn new(idx: usize, shared: Arc<Shared>, rng: Rng) -> Runner {
        Runner {
            idx,
            shared,
            rng,
            conn: None,
            attached: BTreeSet::new(),
            sessions: Vec::new(),
            submitted_here: 0,
            next_token: 0,
            queued: Vec::new(),
        }
    }

    fn stopping(&self) -> bool {
        self.shared.stop.load(Ordering::SeqCst)
    }

    fn violation(&self, msg: String) {
        self.shared
            .book()
            .violation(format!("client {}: {msg}", self.idx));
    }

    fn lost(&mut self) {
        if self.conn.take().is_some() {
            self.shared.book().stats.disconnects += 1;
        }
        self.attached.clear();
    }

    /// Connects to the daemon named in `daemon.json`, as a real client does after a restart.
    async fn ensure_conn(&mut self) -> bool {
        if self.conn.is_some() {
            return true;
        }
        let Ok(text) = std::fs::read_to_string(self.shared.home.join("daemon.json")) else {
            return false;
        };
        let Ok(info) = serde_json::from_str::<Value>(&text) else {
            return false;
        };
        let (Some(url), Some(token)) = (info["url"].as_str(), info["token"].as_str()) else {
            return false;
        };
        match Client::connect(url, Some(token)).await {
            Ok(c) => {
                self.conn = Some(c);
                self.attached.clear();
                true
            }
            Err(_) => false,
        }
    }

    async fn call(&mut self, method: &str, params: Value) -> Rpc {
        let Some(c) = self.conn.as_mut() else {
            return Rpc::Lost;
        };
        let out = match c.call(method, params).await {
            Ok(Ok(v)) => Rpc::Ok(v),
            // A full disk refuses writes: nothing was acknowledged, so it is as if the answer
            // never came (the client re-submits later, G1).
            Ok(Err(e)) if reason(&e) == "storage_unavailable" && self.shared.disk_was_full() => {
                self.shared.book().stats.storage_refusals += 1;
                Rpc::Lost
            }
            Ok(Err(e)) => Rpc::Err(e),
            Err(e) => {
                let msg = format!("{e:#}");
                // A killed or stopped daemon closes the socket at once; silence is a hang.
                if msg.contains("no response within") {
                    self.violation(format!("{method} got no answer from a live connection"));
                }
                self.lost();
                return Rpc::Lost;
            }
        };
        self.drain_events().await;
        out
    }

    /// Records every event already received.
    async fn drain_events(&mut self) {
        loop {
            let Some(c) = self.conn.as_mut() else {
                return;
            };
            match c.next_event(Duration::ZERO).await {
                Ok(Some(e)) => self.shared.book().observe_event(&e),
                Ok(None) => return,
                Err(_) => {
                    self.lost();
                    return;
                }
            }
        }
    }

    /// `session.resume`, which also attaches. Records what the snapshot shows.
    async fn resume(&mut self, session: &str) -> Option<Value> {
        match self
            .call("session.resume", json!({"session_id": session}))
            .await
        {
            Rpc::Ok(v) => {
                self.attached.insert(session.to_string());
                let mut book = self.shared.book();
                let mut queued = Vec::new();
                for p in v["pending"].as_array().into_iter().flatten() {
                    let aid = aid_of(p);
                    match p["status"].as_str() {
                        Some("unknown") => {
                            book.ever_unknown.insert(aid);
                        }
                        Some("queued") => queued.push(aid),
                        Some("started") => {}
                        _ => book.violation(format!("bad pending entry {p}")),
                    }
                    let input = p["input_id"]
                        .as_str()
                        .and_then(|t| book.inputs.get_mut(t))
                        .filter(|i| i.session == session);
                    let bad = match input {
                        None => Some(format!("pending entry of no input we sent: {p}")),
                        Some(input) => match &input.admission_id {
                            None => {
                                input.seen_pending = Some(aid_of(p));
                                None
                            }
                            Some(acked) if *acked != aid_of(p) => Some(format!(
                                "G1: input acknowledged as {acked} is pending as {p}"
                            )),
                            Some(_) => None,
                        },
                    };
                    if let Some(msg) = bad {
                        book.violation(msg);
                    }
                }
                drop(book);
                if self.sessions.last().map(String::as_str) == Some(session) {
                    self.queued = queued;
                }
                Some(v)
            }
            Rpc::Err(e) => {
                self.violation(format!("session.resume {session}: {e}"));
                None
            }
            Rpc::Lost => None,
        }
    }

    async fn ensure_attached(&mut self, session: &str) -> bool {
        self.attached.contains(session) || self.resume(session).await.is_some()
    }

    /// Creates the next session (idempotent on its request id, so a lost answer is retried).
    async fn create_session(&mut self) -> bool {
        let request_id = format!("chaos-c{}-s{}", self.idx, self.sessions.len());
        let params = json!({"request_id": request_id, "cwd": self.shared.cwd, "title": request_id});
        match self.call("session.create", params).await {
            Rpc::Ok(v) => {
                let sid = v["session_id"].as_str().unwrap_or_default().to_string();
                self.attached.insert(sid.clone());
                self.sessions.push(sid);
                self.submitted_here = 0;
                self.queued.clear();
                self.shared.book().stats.sessions += 1;
                true
            }
            Rpc::Err(e) => {
                if reason(&e) != "runtime_draining" {
                    self.violation(format!("session.create: {e}"));
                }
                false
            }
            Rpc::Lost => false,
        }
    }

    /// Submits (or re-submits) `token` to `session`.
    async fn submit(&mut self, session: &str, token: &str) {
        if !self.ensure_attached(session).await {
            return;
        }
        {
            let mut book = self.shared.book();
            let input = book.inputs.entry(token.to_string()).or_insert(Input {
                session: session.to_string(),
                admission_id: None,
                attempts: 0,
                seen_pending: None,
            });
            input.attempts += 1;
            if input.attempts > 1 {
                book.stats.resubmits += 1;
            } else {
                book.stats.submitted += 1;
            }
        }
        let params = json!({"session_id": session, "input_id": token, "text": token});
        self.shared.submitting.fetch_add(1, Ordering::SeqCst);
        let answer = self.call("prompt.submit", params).await;
        self.shared.submitting.fetch_sub(1, Ordering::SeqCst);
        match answer {
            Rpc::Ok(r) => self.shared.book().observe_ack(token, &r),
            Rpc::Err(e) if reason(&e) == "runtime_draining" => {
                self.shared.book().stats.draining_refusals += 1
            }
            Rpc::Err(e) => self.violation(format!("prompt.submit {token}: {e}")),
            Rpc::Lost => {}
        }
    }

    /// `prompt.receipt` of each admission not yet seen terminal.
    async fn poll(&mut self, session: &str) {
        let open = self.shared.book().open_admissions(session);
        for aid in open {
            let params = json!({"session_id": session, "admission_id": aid});
            match self.call("prompt.receipt", params).await {
                Rpc::Ok(r) => self.shared.book().observe_receipt(&r, "prompt.receipt"),
                Rpc::Err(e) => self.violation(format!("prompt.receipt {aid}: {e}")),
                Rpc::Lost => return,
            }
        }
    }

    /// Resolves the unknown admissions of a snapshot; each with `percent` chance.
    async fn resolve_unknowns(&mut self, session: &str, snapshot: &Value, percent: u64) {
        let unknown: Vec<String> = snapshot["pending"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["status"] == "unknown")
            .filter_map(|p| p["admission_id"].as_str().map(str::to_string))
            .collect();
        for aid in unknown {
            if !self.rng.chance(percent) {
                continue;
            }
            let params = json!({"session_id": session, "admission_id": aid});
            match self.call("prompt.resolve_unknown", params).await {
                Rpc::Ok(r) => {
                    let mut book = self.shared.book();
                    book.stats.resolves += 1;
                    if r["status"] != "terminal" {
                        book.violation(format!("resolve_unknown left {aid} non-terminal: {r}"));
                    }
                    book.observe_receipt(&r, "prompt.resolve_unknown");
                }
                Rpc::Err(e) => self.violation(format!("prompt.resolve_unknown {aid}: {e}")),
                Rpc::Lost => return,
            }
        }
    }

    /// Interrupts the running turn of `session`, if a snapshot shows one.
    async fn interrupt(&mut self, session: &str) {
        let Some(snap) = self.resume(session).await else {
            return;
        };
        let started = snap["pending"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["status"] == "started")
            .map(|p| p["execution_generation"].clone());
        let Some(generation) = started else {
            return;
        };
        let params = json!({"session_id": session, "execution_generation": generation});
        match self.call("session.interrupt", params).await {
            Rpc::Ok(_) => self.shared.book().stats.interrupts += 1,
            // The turn ended (settled or lost) since the snapshot.
            Rpc::Err(e) if reason(&e) == "stale_generation" => {
                self.shared.book().stats.interrupt_races += 1
            }
            Rpc::Err(e) => self.violation(format!("session.interrupt {generation}: {e}")),
            Rpc::Lost => {}
        }
    }

    /// Cancels one queued admission of the current session, if the snapshot showed one.
    async fn cancel_one(&mut self, session: &str) {
        let Some(aid) = self.rng.pick(&self.queued).cloned() else {
            return;
        };
        if !self.ensure_attached(session).await {
            return;
        }
        let params = json!({"session_id": session, "admission_id": aid});
        match self.call("prompt.cancel", params).await {
            Rpc::Ok(r) => {
                let mut book = self.shared.book();
                if r["status"] != "terminal" {
                    book.violation(format!("prompt.cancel left {aid} non-terminal: {r}"));
                }
                if r["outcome"] == "cancelled" {
                    book.stats.cancels += 1;
                }
                book.observe_receipt(&r, "prompt.cancel");
            }
            // The turn was claimed, or claimed and lost, since the snapshot.
            Rpc::Err(e) if matches!(reason(&e), "stale_generation" | "unknown_execution") => {
                self.shared.book().stats.cancel_races += 1
            }
            Rpc::Err(e) => self.violation(format!("prompt.cancel {aid}: {e}")),
            Rpc::Lost => {}
        }
        self.queued.retain(|q| *q != aid);
    }

    /// The chaos phase, then the drain. `Err` describes a session that would not drain.
    async fn run(mut self) -> Result<(), String> {
        while !self.stopping() {
            self.step().await;
            tokio::time::sleep(self.rng.millis(100)).await;
        }
        self.drain().await
    }

    async fn step(&mut self) {
        if !self.ensure_conn().await {
            tokio::time::sleep(Duration::from_millis(30)).await;
            return;
        }
        let rotate = match self.sessions.last() {
            None => true,
            Some(s) => {
                self.submitted_here >= ROTATE_AFTER && self.shared.book().unacked(s).is_empty()
            }
        };
        if rotate && !self.create_session().await {
            return;
        }
        let session = self.sessions.last().cloned().expect("a current session");
        if !self.ensure_attached(&session).await {
            return;
        }
        let (unacked, open) = {
            let book = self.shared.book();
            (book.unacked(&session), book.open_admissions(&session).len())
        };
        let roll = self.rng.below(100);
        if let Some(token) = self.rng.pick(&unacked).filter(|_| roll < 50).cloned() {
            self.submit(&session, &token).await;
        } else if roll < 70 && unacked.len() + open < MAX_OUTSTANDING {
            let token = format!("tok-c{}-{:05}", self.idx, self.next_token);
            self.next_token += 1;
            self.submitted_here += 1;
            self.submit(&session, &token).await;
        } else if roll < 80 {
            if let Some(snap) = self.resume(&session).await {
                self.resolve_unknowns(&session, &snap, 60).await;
            }
        } else if roll < 82 {
            self.interrupt(&session).await;
        } else if roll < 92 {
            self.poll(&session).await;
        } else if roll < 96 {
            self.cancel_one(&session).await;
        } else if roll < 98 {
            // Detach is not cancel (G3): close the connection; turns go on without us.
            self.conn = None;
            self.attached.clear();
            self.shared.book().stats.drops += 1;
        }
        self.drain_events().await;
    }

    /// Re-submits what was never acknowledged, resolves every unknown, and waits until each
    /// session has nothing pending. All sessions are drained together, in rounds.
    async fn drain(mut self) -> Result<(), String> {
        let deadline = Instant::now() + DRAIN_BOUND;
        let mut left: Vec<String> = self.sessions.clone();
        let mut last: HashMap<String, Value> = HashMap::new();
        while !left.is_empty() {
            if Instant::now() > deadline {
                let book = self.shared.book();
                let report: Vec<String> = left
                    .iter()
                    .map(|s| {
                        format!(
                            "session {s}: unacknowledged {:?}, last pending {}",
                            book.unacked(s),
                            last.get(s).map_or(Value::Null, |v| v["pending"].clone())
                        )
                    })
                    .collect();
                return Err(format!(
                    "client {}: sessions did not drain within {DRAIN_BOUND:?}: {}",
                    self.idx,
                    report.join("; ")
                ));
            }
            if !self.ensure_conn().await {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            let mut still = Vec::new();
            for session in left {
                let unacked = self.shared.book().unacked(&session);
                for token in unacked {
                    self.submit(&session, &token).await;
                }
                let Some(snap) = self.resume(&session).await else {
                    still.push(session);
                    continue;
                };
                let unacked = self.shared.book().unacked(&session);
                let pending = snap["pending"].as_array().map_or(0, Vec::len);
                if pending == 0 && unacked.is_empty() {
                    // Nothing pending: every admission is terminal; see each outcome.
                    self.poll(&session).await;
                    if self.shared.book().open_admissions(&session).is_empty() {
                        continue;
                    }
                } else {
                    self.resolve_unknowns(&session, &snap, 100).await;
                }
                last.insert(session.clone(), snap);
                still.push(session);
            }
            left = still;
            if !left.is_empty() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// The model

/// Answers a request whose last message is the user's token with a `terminal` call appending
/// the token to `side_effects`, and any later request of the turn with a text answer. Adds a
/// random delay to some replies, and holds the next reply at the armed gate, if any.
fn responder(
    side_effects: &Path,
    rng: Rng,
    armed: Arc<Mutex<Option<Gate>>>,
) -> impl Fn(&Value) -> Reply + Send + Sync + 'static {
    let file = side_effects.display().to_string();
    let rng = Mutex::new(rng);
    move |req: &Value| {
        let messages = req["messages"].as_array().cloned().unwrap_or_default();
        let token = messages
            .iter()
            .rev()
            .find(|m| m["role"] == "user")
            .and_then(|m| m["content"].as_str())
            .unwrap_or("no-token")
            .to_string();
        let first = messages.last().is_some_and(|m| m["role"] == "user");
        let mut rng = lock(&rng);
        let mut reply = if first {
            let append = format!("echo {token} >> '{file}'");
            let command = match rng.below(20) {
                0..=6 => append,
                7..=12 => format!("sleep 0.2; {append}"),
                13..=18 => format!("{append}; sleep 0.2"),
                // Outlasts the 1 s drain grace: a graceful stop then kills the worker.
                _ => format!("trap '' TERM; sleep 1.5; {append}"),
            };
            Reply::tool_call(
                format!("call-{token}"),
                "terminal",
                json!({"command": command}),
            )
        } else {
            Reply::text(format!("done {token}"))
        };
        if rng.chance(30) {
            reply = reply.delay(rng.millis(150));
        }
        if let Some(gate) = lock(&armed).take() {
            reply = reply.gated(&gate);
        }
        reply
    }
}

// ---------------------------------------------------------------------------------------------
// The chaos loop

#[derive(Default, Debug)]
struct ChaosStats {
    worker_kills: u64,
    /// Worker templates and spares SIGKILLed (with the running workers, at times).
    template_kills: u64,
    spare_kills: u64,
    mid_tool_kills: u64,
    gated_kills: u64,
    owner_kills: u64,
    mid_submit_kills: u64,
    killed_while_stopping: u64,
    graceful_stops: u64,
    gated_holds: u64,
    disk_full_windows: u64,
    /// `drover restart` handoffs, and the running turns their next owners adopted.
    restarts: u64,
    adopted: u64,
    /// The most file descriptors and RSS (KiB) any owner had at a step.
    most_fds: usize,
    most_rss_kib: u64,
}

struct Chaos {
    rng: Rng,
    home: PathBuf,
    /// Where every owner's stderr goes.
    stderr_log: PathBuf,
    daemon: Daemon,
    epoch: u64,
    armed: Arc<Mutex<Option<Gate>>>,
    /// The clients' shared state (for their count of submits in flight).
    shared: Arc<Shared>,
    /// Workers and their tool processes at an owner kill.
    orphans: Vec<Proc>,
    stats: ChaosStats,
    violations: Vec<String>,
    /// The home is a small tmpfs of its own: disk-full windows are possible.
    small_disk: bool,
}

/// How long an old owner has to exit once it handed the home over.
const WAIT_EXIT: Duration = Duration::from_secs(30);

/// How many turns the latest owner start lost (`unknown_admissions` of its `recovered` line in
/// `daemon.log`).
fn handoff_recovery_lost(home: &Path) -> u64 {
    let log = std::fs::read_to_string(home.join("logs").join("daemon.log")).unwrap_or_default();
    log.lines()
        .rev()
        .find(|l| l.contains("recovered"))
        .and_then(|l| l.split("unknown_admissions=").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Starts the owner with its stderr appended to `stderr_log` (errors met before its log is
/// open, such as a held lock, only go there).
async fn start_owner(home: &Path, stderr_log: &Path) -> anyhow::Result<Daemon> {
    Daemon::start_with_stderr(bin(), home, &[("NO_COLOR", "1")], stderr_log).await
}

/// `pid (command)` of every process with `path` open.
fn holders(path: &Path) -> Vec<String> {
    pids()
        .into_iter()
        .filter(|&pid| open_files(pid).iter().any(|l| l == path))
        .map(|pid| {
            let cmd = String::from_utf8_lossy(&cmdline(pid)).replace('\0', " ");
            format!("{pid} ({})", cmd.trim())
        })
        .collect()
}

/// A process, told apart from a later one with the same pid by its start time.
#[derive(Clone, Debug, PartialEq)]
struct Proc {
    pid: u32,
    start: u64,
    cmdline: String,
}

impl Proc {
    fn of(pid: u32) -> Option<Proc> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Field 22 (`starttime`) is the 20th after the `)` that ends the command name.
        let start = stat
            .rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(19)?
            .parse()
            .ok()?;
        let cmdline = String::from_utf8_lossy(&cmdline(pid)).replace('\0', " ");
        Some(Proc {
            pid,
            start,
            cmdline: cmdline.trim().to_string(),
        })
    }

    /// Still running (not a zombie), and still the same process.
    fn alive(&self) -> bool {
        pid_alive(self.pid) && Proc::of(self.pid).is_some_and(|p| p.start == self.start)
    }
}

fn cmdline(pid: u32) -> Vec<u8> {
    std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default()
}

impl Chaos {
    fn violation(&mut self, msg: String) {
        eprintln!("{} VIOLATION: {msg}", replay_note());
        self.violations.push(msg);
    }

    async fn restart(&mut self) {
        let daemon = match start_owner(&self.home, &self.stderr_log).await {
            Ok(d) => d,
            Err(e) => fail!(
                "restarting the owner: {e:#}\nprocesses holding daemon.lock: {:?}",
                holders(&self.home.join("daemon.lock"))
            ),
        };
        if daemon.epoch() != self.epoch + 1 {
            let msg = format!(
                "the epoch went from {} to {} across a restart",
                self.epoch,
                daemon.epoch()
            );
            self.violation(msg);
        }
        self.epoch = daemon.epoch();
        self.daemon = daemon;
    }

    /// SIGKILLs `pid` (a worker).
    fn kill_worker(&mut self, pid: u32) {
        signal(pid, Signal::SIGKILL);
        self.stats.worker_kills += 1;
    }

    async fn kill_owner(&mut self) {
        for w in self.daemon.worker_pids() {
            let tools = children_of(w);
            self.orphans.extend(Proc::of(w));
            self.orphans.extend(tools.into_iter().filter_map(Proc::of));
        }
        self.daemon
            .kill()
            .unwrap_or_else(|e| fail!("killing the owner: {e:#}"));
        self.stats.owner_kills += 1;
        let pause = self.rng.millis(300);
        tokio::time::sleep(pause).await;
        self.restart().await;
    }

    async fn graceful_stop(&mut self) {
        match self.daemon.stop().await {
            Ok(status) if status.code() == Some(0) => {}
            Ok(status) => self.violation(format!("a graceful stop exited with {status}")),
            Err(e) => self.violation(format!("graceful stop: {e:#}")),
        }
        self.stats.graceful_stops += 1;
        let pause = self.rng.millis(300);
        tokio::time::sleep(pause).await;
        self.restart().await;
    }

    /// `drover restart`: the next owner adopts every running turn. It must succeed, raise the
    /// epoch by one, and its recovery must find nothing to lose (every running turn was
    /// adopted; `unknown` comes from kills only).
    async fn hand_over(&mut self) {
        let old = self.daemon.pid();
        let out =
            drover_test_support::harness::run_drover(bin(), &self.home, None, &["restart"]).await;
        let said = String::from_utf8_lossy(&out.stderr).to_string();
        if !out.status.success() {
            self.violation(format!("drover restart failed: {said}"));
            return;
        }
        if let Err(e) = self.daemon.wait_exit(WAIT_EXIT).await {
            self.violation(format!(
                "the old owner did not exit after the handoff: {e:#}"
            ));
        }
        let next = Daemon::handed_over(bin(), &self.home, old)
            .await
            .unwrap_or_else(|e| fail!("finding the next owner: {e:#}"));
        if next.epoch() != self.epoch + 1 {
            let msg = format!(
                "the epoch went from {} to {} across a handoff",
                self.epoch,
                next.epoch()
            );
            self.violation(msg);
        }
        self.epoch = next.epoch();
        self.daemon = next;
        self.stats.restarts += 1;
        self.stats.adopted += said
            .split(" running turn(s) adopted")
            .next()
            .and_then(|head| head.rsplit(' ').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
        let lost = handoff_recovery_lost(&self.home);
        if lost != 0 {
            self.violation(format!(
                "the next owner's recovery lost {lost} turn(s) in a handoff"
            ));
        }
    }

    /// Fills the home's tmpfs, keeps it full for up to 1.5 s, then frees it. Writes fail
    /// meanwhile (`storage_unavailable`); nothing acknowledged may be lost, and no turn may be
    /// left `started` once there is room again.
    async fn disk_full_window(&mut self) {
        use std::io::Write;
        let filler = self.home.join("filler");
        lock(&self.shared.disk_full).open = true;
        if let Ok(mut f) = std::fs::File::create(&filler) {
            let big = vec![0u8; 1 << 20];
            while f.write_all(&big).is_ok() {}
            let small = [0u8; 4096];
            while f.write_all(&small).is_ok() {}
        }
        self.stats.disk_full_windows += 1;
        let hold = self.rng.millis(1500);
        tokio::time::sleep(hold).await;
        if let Err(e) = std::fs::remove_file(&filler) {
            fail!("removing the disk filler: {e}");
        }
        let mut d = lock(&self.shared.disk_full);
        d.open = false;
        d.closed_at = Some(Instant::now());
    }

    async fn step(&mut self) {
        let pause = self.rng.millis(300);
        tokio::time::sleep(pause).await;
        let pid = self.daemon.pid();
        self.stats.most_fds = self.stats.most_fds.max(fd_count(pid));
        self.stats.most_rss_kib = self.stats.most_rss_kib.max(rss_kib(pid));
        match self.rng.below(100) {
            // A worker at a random point of its turn.
            0..=29 => {
                let workers = self.daemon.worker_pids();
                if let Some(&w) = self.rng.pick(&workers) {
                    self.kill_worker(w);
                }
            }
            // A worker whose tool is running (or the owner then).
            30..=39 => {
                let deadline = Instant::now() + Duration::from_millis(1500);
                while Instant::now() < deadline {
                    let busy: Vec<u32> = self
                        .daemon
                        .worker_pids()
                        .into_iter()
                        .filter(|w| !children_of(*w).is_empty())
                        .collect();
                    if let Some(&w) = self.rng.pick(&busy) {
                        let pause = self.rng.millis(100);
                        tokio::time::sleep(pause).await;
                        if self.rng.chance(25) {
                            self.kill_owner().await;
                        } else if self.daemon.worker_pids().contains(&w) {
                            // (Still our worker: its pid was not freed and reused meanwhile.)
                            self.kill_worker(w);
                            self.stats.mid_tool_kills += 1;
                        }
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            // While the model holds a response.
            40..=54 => {
                let gate = Gate::new();
                *lock(&self.armed) = Some(gate.clone());
                if gate.wait_reached(Duration::from_secs(2)).await {
                    self.stats.gated_holds += 1;
                    let pause = self.rng.millis(200);
                    tokio::time::sleep(pause).await;
                    match self.rng.below(6) {
                        0 | 1 => {
                            // The held request's worker is one of these.
                            for w in self.daemon.worker_pids() {
                                self.kill_worker(w);
                                self.stats.gated_kills += 1;
                            }
                        }
                        2 => self.kill_owner().await,
                        3 => self.graceful_stop().await,
                        4 => self.hand_over().await,
                        _ => {}
                    }
                } else {
                    lock(&self.armed).take();
                }
                gate.open();
            }
            55..=64 => self.kill_owner().await,
            // While a submit waits for its answer (G1: answered only once committed).
            65..=69 => {
                let deadline = Instant::now() + Duration::from_secs(2);
                while Instant::now() < deadline {
                    if self.shared.submitting.load(Ordering::SeqCst) > 0 {
                        self.stats.mid_submit_kills += 1;
                        self.kill_owner().await;
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            70..=76 => self.graceful_stop().await,
            // The disk fills up for a while (then has room again).
            80..=84 if self.small_disk => self.disk_full_window().await,
            // The worker template and its spares, sometimes with the running workers: every
            // claimed turn still ends, and one nothing ran of runs on a fresh worker.
            85..=94 => {
                let choice = 1 + self.rng.below(7);
                if choice & 1 != 0 {
                    for t in self.daemon.template_pids() {
                        signal(t, Signal::SIGKILL);
                        self.stats.template_kills += 1;
                    }
                }
                if choice & 2 != 0 {
                    for spare in self.daemon.spare_pids() {
                        signal(spare, Signal::SIGKILL);
                        self.stats.spare_kills += 1;
                    }
                }
                if choice & 4 != 0 {
                    for w in self.daemon.worker_pids() {
                        self.kill_worker(w);
                    }
                }
            }
            // A handoff to the next owner, which adopts whatever runs.
            95..=99 => self.hand_over().await,
            // SIGKILL in the middle of a graceful stop.
            77..=79 => {
                signal(self.daemon.pid(), Signal::SIGTERM);
                let pause = self.rng.millis(600);
                tokio::time::sleep(pause).await;
                self.stats.killed_while_stopping += 1;
                self.kill_owner().await;
            }
            _ => {}
        }
    }
}

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// A small tmpfs mounted on the test home, so the chaos can fill the disk. Unmounted on drop.
struct SmallDisk {
    at: PathBuf,
}

impl SmallDisk {
    /// Mounts one (root only; `None` with the reason otherwise).
    fn mount(at: &Path, mib: u64) -> Result<SmallDisk, String> {
        let out = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={mib}m,mode=0700"),
                "tmpfs",
            ])
            .arg(at)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
        Ok(SmallDisk {
            at: at.to_path_buf(),
        })
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.at)
            .status();
    }
}

/// Connection churn: connect to whatever daemon `daemon.json` names, make a call or not, and
/// close, as fast as the daemon lets it, until `stop`. Returns the cycles made.
async fn churn(home: PathBuf, stop: Arc<AtomicBool>, mut rng: Rng) -> u64 {
    let mut cycles = 0;
    while !stop.load(Ordering::SeqCst) {
        let info = std::fs::read_to_string(home.join("daemon.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok());
        let target = info.as_ref().and_then(|i| {
            Some((
                i["url"].as_str()?.to_string(),
                i["token"].as_str()?.to_string(),
            ))
        });
        if let Some((url, token)) = target {
            if let Ok(mut c) = Client::connect(&url, Some(&token)).await {
                if rng.chance(70) {
                    let _ = c.call("session.list", json!({"limit": 5})).await;
                }
                cycles += 1;
            }
        }
        tokio::time::sleep(rng.millis(20)).await;
    }
    cycles
}

// ---------------------------------------------------------------------------------------------
// The ledger at the end

fn db_count(db: &Path, sql: &str) -> i64 {
    db_value(db, sql)
        .as_i64()
        .unwrap_or_else(|| fail!("{sql} gave no count"))
}

/// One `session_admissions` row with its executions and user messages.
struct Row {
    admission_id: String,
    token: String,
    session: String,
    status: String,
    outcome: Option<String>,
    was_unknown: bool,
    executions: i64,
    user_messages: i64,
}

fn ledger_admissions(db: &Path) -> Vec<Row> {
    db_rows(
        db,
        "SELECT a.admission_id, a.request_id, a.target_session_id, a.status, a.outcome,
                a.unknown_at IS NOT NULL,
                (SELECT count(*) FROM worker_executions e WHERE e.admission_id = a.admission_id),
                (SELECT count(*) FROM messages m
                  WHERE m.admission_id = a.admission_id AND m.role = 'user')
         FROM session_admissions a ORDER BY a.seq",
    )
    .into_iter()
    .map(|r| Row {
        admission_id: r[0].as_str().unwrap_or_default().to_string(),
        token: r[1].as_str().unwrap_or_default().to_string(),
        session: r[2].as_str().unwrap_or_default().to_string(),
        status: r[3].as_str().unwrap_or_default().to_string(),
        outcome: r[4].as_str().map(str::to_string),
        was_unknown: r[5].as_i64() == Some(1),
        executions: r[6].as_i64().unwrap_or(-1),
        user_messages: r[7].as_i64().unwrap_or(-1),
    })
    .collect()
}

/// What the final checks counted.
#[derive(Default, Debug)]
struct Outcomes {
    admissions: usize,
    completed: usize,
    interrupted: usize,
    resolved_unknown: usize,
    failed: usize,
    cancelled: usize,
    side_effects: usize,
}

/// Checks the ledger, the side-effect file and the model's requests against what the clients
/// saw. Returns the broken guarantees.
fn final_checks(
    db: &Path,
    side_effects: &Path,
    book: &Book,
    requests: &[Value],
    out: &mut Outcomes,
) -> Vec<String> {
    let mut bad = Vec::new();
    let rows = ledger_admissions(db);
    out.admissions = rows.len();
    let by_id: HashMap<&str, &Row> = rows.iter().map(|r| (r.admission_id.as_str(), r)).collect();

    // Every acknowledged input is in the ledger, once, under the admission it was answered
    // with; the ledger holds no input we did not send.
    let mut per_token: HashMap<&str, usize> = HashMap::new();
    for r in &rows {
        *per_token.entry(r.token.as_str()).or_default() += 1;
        match book.inputs.get(&r.token) {
            Some(i) if i.session == r.session => {}
            _ => bad.push(format!(
                "admission {} ({}) is no input we sent to session {}",
                r.admission_id, r.token, r.session
            )),
        }
    }
    for (token, input) in &book.inputs {
        let Some(aid) = &input.admission_id else {
            bad.push(format!("input {token} was never acknowledged"));
            continue;
        };
        match by_id.get(aid.as_str()) {
            None => bad.push(format!(
                "G1: acknowledged input {token} (admission {aid}) is not in the ledger"
            )),
            Some(r) if r.token != *token || r.session != input.session => bad.push(format!(
                "G1: admission {aid} holds {} of session {}, not {token} of {}",
                r.token, r.session, input.session
            )),
            Some(_) => {}
        }
        if per_token.get(token.as_str()).copied().unwrap_or(0) != 1 {
            bad.push(format!(
                "G1: input {token} has {} admissions",
                per_token.get(token.as_str()).copied().unwrap_or(0)
            ));
        }
    }

    // No session is stuck: everything is terminal, nothing holds a lease, nothing is live.
    for r in &rows {
        if r.status != "terminal" {
            bad.push(format!(
                "admission {} ({}) is still {} after the drain",
                r.admission_id, r.token, r.status
            ));
        }
    }
    let leases = db_count(db, "SELECT count(*) FROM session_turn_leases");
    if leases != 0 {
        bad.push(format!("{leases} turn leases left after the drain"));
    }
    let live = db_count(
        db,
        "SELECT count(*) FROM worker_executions WHERE status != 'terminal'",
    );
    if live != 0 {
        bad.push(format!(
            "{live} worker executions are not terminal after the drain"
        ));
    }
    let open_prompts = db_count(db, "SELECT count(*) FROM prompts WHERE status = 'open'");
    if open_prompts != 0 {
        bad.push(format!("{open_prompts} prompts still open after the drain"));
    }

    // No terminal admission ever changed outcome.
    for (aid, (outcome, seen)) in &book.terminal {
        match by_id.get(aid.as_str()) {
            Some(r) if r.outcome.as_deref() == Some(outcome.as_str()) => {}
            Some(r) => bad.push(format!(
                "admission {aid} ({}) was seen terminal/{outcome} in {seen}, the ledger says \
                 {}/{:?}",
                r.token, r.status, r.outcome
            )),
            None => bad.push(format!(
                "admission {aid} was seen terminal/{outcome} in {seen} but is not in the ledger"
            )),
        }
    }

    // G2: a lost turn is never replayed. It ends `interrupted` (only resolve_unknown moves
    // it), ran at most one execution, and its input reached the model in no later turn.
    for aid in &book.ever_unknown {
        match by_id.get(aid.as_str()) {
            Some(r) if r.was_unknown && r.outcome.as_deref() == Some("interrupted") => {}
            Some(r) => bad.push(format!(
                "admission {aid} ({}) was seen unknown but ended {}/{:?} (unknown_at set: {})",
                r.token, r.status, r.outcome, r.was_unknown
            )),
            None => bad.push(format!(
                "admission {aid} was seen unknown but is not in the ledger"
            )),
        }
    }
    let mut lost_tokens = BTreeSet::new();
    for r in &rows {
        match r.outcome.as_deref() {
            Some("completed") => out.completed += 1,
            Some("interrupted") if r.was_unknown => out.resolved_unknown += 1,
            Some("interrupted") => out.interrupted += 1,
            Some("failed") => out.failed += 1,
            Some("cancelled") => out.cancelled += 1,
            _ => {}
        }
        if r.was_unknown {
            lost_tokens.insert(r.token.clone());
            if r.outcome.as_deref() != Some("interrupted") {
                bad.push(format!(
                    "admission {} ({}) was unknown but ended {:?}",
                    r.admission_id, r.token, r.outcome
                ));
            }
        }
        let expected = i64::from(r.outcome.as_deref() != Some("cancelled"));
        if r.executions != expected || r.user_messages != expected {
            bad.push(format!(
                "admission {} ({}, {:?}) has {} executions and {} user messages, expected \
                 {expected}",
                r.admission_id, r.token, r.outcome, r.executions, r.user_messages
            ));
        }
    }

    // At most once: no token in the side-effect file twice; every completed turn ran its
    // tool exactly once; no cancelled or never-started input ran.
    let text = std::fs::read_to_string(side_effects).unwrap_or_default();
    let mut effects: BTreeMap<&str, usize> = BTreeMap::new();
    for line in text.lines() {
        *effects.entry(line.trim()).or_default() += 1;
        out.side_effects += 1;
    }
    let by_token: HashMap<&str, &Row> = rows.iter().map(|r| (r.token.as_str(), r)).collect();
    for (token, n) in &effects {
        if *n > 1 {
            bad.push(format!("G2: {token} is in the side-effect file {n} times"));
        }
        match by_token.get(token) {
            None => bad.push(format!(
                "{token} is in the side-effect file but not in the ledger"
            )),
            Some(r) if r.executions == 0 || r.outcome.as_deref() == Some("cancelled") => {
                bad.push(format!(
                    "{token} ran although its admission {} never started ({:?})",
                    r.admission_id, r.outcome
                ))
            }
            Some(_) => {}
        }
    }
    for r in &rows {
        if r.outcome.as_deref() == Some("completed")
            && effects.get(r.token.as_str()).copied() != Some(1)
        {
            bad.push(format!(
                "completed admission {} ({}) is in the side-effect file {} times",
                r.admission_id,
                r.token,
                effects.get(r.token.as_str()).copied().unwrap_or(0)
            ));
        }
    }

    // The stored event streams agree with the ledger: `seq` 1, 2, 3, ... per session, and each
    // admission's last `admission.updated` says its final status and outcome.
    let events = db_rows(
        db,
        "SELECT session_id, seq, type, payload_json FROM session_events ORDER BY session_id, seq",
    );
    let mut expected_seq: HashMap<String, i64> = HashMap::new();
    let mut last_update: HashMap<String, (String, Option<String>)> = HashMap::new();
    for e in &events {
        let session = e[0].as_str().unwrap_or_default().to_string();
        let seq = e[1].as_i64().unwrap_or(-1);
        let next = expected_seq.entry(session.clone()).or_insert(1);
        if seq != *next {
            bad.push(format!(
                "session {session}: stored event seq {seq} where {next} was due"
            ));
        }
        *next = seq + 1;
        if e[2] == "admission.updated" {
            let payload: Value =
                serde_json::from_str(e[3].as_str().unwrap_or_default()).unwrap_or_default();
            last_update.insert(
                aid_of(&payload),
                (
                    payload["status"].as_str().unwrap_or_default().to_string(),
                    payload["outcome"].as_str().map(str::to_string),
                ),
            );
        }
    }
    for r in &rows {
        match last_update.get(&r.admission_id) {
            Some((status, outcome)) if *status == r.status && *outcome == r.outcome => {}
            other => bad.push(format!(
                "admission {} ({}) is {}/{:?} but its last stored admission.updated says {other:?}",
                r.admission_id, r.token, r.status, r.outcome
            )),
        }
    }

    // A settled turn has its stored result, with its own final answer; a lost one has none.
    let results: HashMap<String, Value> = db_rows(
        db,
        "SELECT substr(key, 18), value FROM state_meta WHERE key LIKE 'admission.result.%'",
    )
    .into_iter()
    .map(|r| {
        let value = serde_json::from_str(r[1].as_str().unwrap_or_default()).unwrap_or_default();
        (r[0].as_str().unwrap_or_default().to_string(), value)
    })
    .collect();
    for r in &rows {
        let stored = results.get(&r.admission_id);
        if r.was_unknown || r.outcome.as_deref() == Some("cancelled") {
            if let Some(v) = stored {
                bad.push(format!(
                    "admission {} ({}, {:?}, unknown: {}) has a stored result {v}",
                    r.admission_id, r.token, r.outcome, r.was_unknown
                ));
            }
        } else if r.outcome.as_deref() == Some("completed") {
            let answer = stored.map(|v| v["result"]["final_response"].clone());
            if answer != Some(json!(format!("done {}", r.token))) {
                bad.push(format!(
                    "completed admission {} ({}) has the stored result {stored:?}",
                    r.admission_id, r.token
                ));
            }
        } else if stored.is_none() {
            bad.push(format!(
                "settled admission {} ({}, {:?}) has no stored result",
                r.admission_id, r.token, r.outcome
            ));
        }
    }

    // The model: each input opened at most one turn, and a lost input is in no later request.
    let mut first_requests: BTreeMap<String, usize> = BTreeMap::new();
    for req in requests {
        let messages = req["messages"].as_array().cloned().unwrap_or_default();
        let own = messages
            .iter()
            .rev()
            .find(|m| m["role"] == "user")
            .and_then(|m| m["content"].as_str())
            .unwrap_or_default()
            .to_string();
        if messages.last().is_some_and(|m| m["role"] == "user") {
            *first_requests.entry(own.clone()).or_default() += 1;
        }
        for m in &messages {
            if let Some(c) = m["content"].as_str().filter(|_| m["role"] == "user") {
                if c != own && lost_tokens.contains(c) {
                    bad.push(format!(
                        "G2: the lost input {c} was sent to the model again in the turn of {own}"
                    ));
                }
            }
        }
    }
    for (token, n) in first_requests {
        if n > 1 {
            bad.push(format!(
                "G2: the model was asked {n} times to start {token}"
            ));
        }
    }
    bad
}

// ---------------------------------------------------------------------------------------------

fn env_opt<T: std::str::FromStr>(name: &str) -> Option<T> {
    let v = std::env::var(name).ok()?;
    Some(
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not valid")),
    )
}

/// The seeds to run and the length of each run's chaos phase, from the environment.
fn plan() -> (Vec<u64>, f64) {
    let secs: Option<f64> = env_opt("DROVER_CHAOS_SECS");
    match (env_opt::<u64>("DROVER_CHAOS_SEED"), secs) {
        (Some(seed), secs) => (vec![seed], secs.unwrap_or(SEED_SECS)),
        (None, Some(secs)) => {
            let clock_seed = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64 ^ u64::from(std::process::id()))
                .unwrap_or(1);
            (vec![clock_seed], secs)
        }
        (None, None) => (SEEDS.to_vec(), SEED_SECS),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_loses_no_input_replays_no_work_and_strands_no_session() {
    let (seeds, secs) = plan();
    // Alone in a process of its own: its panic hook and the run under way are process-wide.
    // Each run is bounded by its chaos phase, the drain and the checks.
    let bound = Duration::from_secs_f64(secs) + DRAIN_BOUND + Duration::from_secs(240);
    if alone::ran_in_child(bound * seeds.len() as u32) {
        return;
    }
    println!("chaos: seeds {seeds:?}, {secs} s of chaos each");
    for seed in seeds {
        chaos_run(seed, secs).await;
    }
}

/// One chaos run on `seed`: `secs` of chaos, the drain, the checks. Panics naming the seed.
async fn chaos_run(seed: u64, secs: f64) {
    println!("chaos: seed {seed}, {secs} s of chaos; replay with DROVER_CHAOS_SEED={seed}");
    let began = Instant::now();

    let model = MockModel::start().await;
    let home = TestHome::new().unwrap();
    let work = tempfile::Builder::new()
        .prefix("drover-chaos-")
        .tempdir()
        .unwrap();
    let side_effects = work.path().join("side_effects");
    *lock(&RUN) = Some(Run {
        seed,
        home: home.path().to_path_buf(),
        side_effects: side_effects.clone(),
        stderr_log: work.path().join("daemon.stderr"),
    });
    install_panic_hook();

    // A small disk of its own, so the chaos can fill it (needs root, as in CI).
    let small_disk = match SmallDisk::mount(home.path(), 256) {
        Ok(d) => Some(d),
        Err(e) => {
            println!("chaos: no disk-full windows (cannot mount a tmpfs home: {e})");
            None
        }
    };
    let mut rng = Rng::new(seed, 0);
    let stream = rng.chance(50);
    home.write_model_config(&model.base_url(), stream, "[approvals]\nmode = \"auto\"\n")
        .unwrap_or_else(|e| fail!("writing the config: {e:#}"));
    let armed = Arc::new(Mutex::new(None));
    model.set_responder(responder(&side_effects, Rng::new(seed, 100), armed.clone()));

    let stderr_log = work.path().join("daemon.stderr");
    let daemon = start_owner(home.path(), &stderr_log)
        .await
        .unwrap_or_else(|e| fail!("starting the owner: {e:#}"));
    let shared = Arc::new(Shared {
        home: home.path().to_path_buf(),
        cwd: work.path().to_path_buf(),
        book: Mutex::new(Book::default()),
        stop: AtomicBool::new(false),
        submitting: AtomicUsize::new(0),
        disk_full: Mutex::new(DiskFull::default()),
    });
    let start_fds = fd_count(daemon.pid());
    let start_rss = rss_kib(daemon.pid());
    let churn_stop = Arc::new(AtomicBool::new(false));
    let churner = tokio::spawn(churn(
        home.path().to_path_buf(),
        churn_stop.clone(),
        Rng::new(seed, 50),
    ));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let runner = Runner::new(i, shared.clone(), Rng::new(seed, 1 + i as u64));
            tokio::spawn(runner.run())
        })
        .collect();

    let mut chaos = Chaos {
        rng,
        home: home.path().to_path_buf(),
        stderr_log: stderr_log.clone(),
        epoch: daemon.epoch(),
        daemon,
        armed: armed.clone(),
        shared: shared.clone(),
        orphans: Vec::new(),
        stats: ChaosStats::default(),
        violations: Vec::new(),
        small_disk: small_disk.is_some(),
    };
    let chaos_end = Instant::now() + Duration::from_secs_f64(secs);
    while Instant::now() < chaos_end {
        if let Some(i) = clients.iter().position(|c| c.is_finished()) {
            fail!("client {i} ended during the chaos");
        }
        chaos.step().await;
    }
    if let Some(gate) = lock(&armed).take() {
        gate.open();
    }

    churn_stop.store(true, Ordering::SeqCst);
    let churn_cycles = tokio::time::timeout(Duration::from_secs(30), churner)
        .await
        .unwrap_or_else(|_| fail!("the connection churn did not stop"))
        .unwrap_or_else(|e| fail!("the connection churn panicked: {e}"));

    // Drain: no more kills; clients re-submit, resolve and wait for their queues.
    let drain_began = Instant::now();
    shared.stop.store(true, Ordering::SeqCst);
    let mut stuck = Vec::new();
    for (i, c) in clients.into_iter().enumerate() {
        match tokio::time::timeout(DRAIN_BOUND + Duration::from_secs(30), c).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => stuck.push(e),
            Ok(Err(e)) => fail!("client {i} panicked: {e}"),
            Err(_) => fail!("client {i} did not finish its drain"),
        }
    }
    let drain_took = drain_began.elapsed();

    // Processes of killed owners must be gone (workers stop when their owner dies).
    let orphan_deadline = Instant::now() + Duration::from_secs(5);
    let mut orphans = chaos.orphans.clone();
    loop {
        orphans.retain(Proc::alive);
        if orphans.is_empty() || Instant::now() > orphan_deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let book = std::mem::take(&mut *shared.book());
    let mut outcomes = Outcomes::default();
    let mut bad = std::mem::take(&mut chaos.violations);
    bad.extend(book.violations.iter().cloned());
    bad.extend(stuck);
    for p in &orphans {
        bad.push(format!(
            "process {} ({}) outlived its killed owner",
            p.pid, p.cmdline
        ));
        signal(p.pid, Signal::SIGKILL);
    }
    let requests = model.requests();
    bad.extend(final_checks(
        &home.db(),
        &side_effects,
        &book,
        &requests,
        &mut outcomes,
    ));

    // Nothing is `started` once every queue drained: a turn left so has no worker.
    let left_started = db_count(
        &home.db(),
        "SELECT count(*) FROM session_admissions WHERE status = 'started'",
    );
    if left_started != 0 {
        bad.push(format!(
            "{left_started} admissions left `started` after the drain"
        ));
    }
    let end_pid = chaos.daemon.pid();
    // Every child the owner forked or started is reaped: none is left a zombie.
    let reaped_by = Instant::now() + Duration::from_secs(5);
    while !zombie_children(end_pid).is_empty() && Instant::now() < reaped_by {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let zombies = zombie_children(end_pid);
    if !zombies.is_empty() {
        bad.push(format!("the owner left zombie children: {zombies:?}"));
    }
    let (end_fds, end_rss) = (fd_count(end_pid), rss_kib(end_pid));
    // The clients' few connections are open now; closed ones must not linger.
    if end_fds > start_fds + 64 {
        bad.push(format!(
            "the owner holds {end_fds} file descriptors at the end, {start_fds} at the start"
        ));
    }
    // A clean stop at the end, and still nothing left behind.
    match chaos.daemon.stop().await {
        Ok(status) if status.code() == Some(0) => {}
        Ok(status) => bad.push(format!("the final graceful stop exited with {status}")),
        Err(e) => bad.push(format!("the final graceful stop: {e:#}")),
    }
    let leases = db_count(&home.db(), "SELECT count(*) FROM session_turn_leases");
    if leases != 0 {
        bad.push(format!("{leases} turn leases left after the final stop"));
    }

    let s = &book.stats;
    let c = &chaos.stats;
    println!(
        "chaos: seed {seed}, stream {stream}, {:.1} s total ({secs} s chaos, drain {:.1} s)\n\
         chaos: sessions {}, turns submitted {}, acknowledged {} ({} only after a re-submit), \
         re-submits {} ({} answers lost after the admission was committed), refused while \
         draining {}, cancels {} (+{} raced a claim), interrupts {} (+{} raced the turn's end), \
         disconnects {}, dropped connections {}\n\
         chaos: admissions {}, completed {}, unknown (resolved) {} ({} resolve calls), \
         interrupted (stop or interrupt) {}, failed {}, cancelled {}, side effects {}, \
         model requests {}\n\
         chaos: worker kills {} (mid-tool {}, model held {}), owner kills {} ({} during a \
         submit, {} during a graceful stop), graceful stops {}, gated holds {}, workers and \
         tools of killed owners checked gone {}\n\
         chaos: templates killed {}, spares killed {}, kills {} in all, disk-full windows {} ({} storage_unavailable answers), \
         connection churn {} cycles, left started {}, owner fds {} at start, {} at the end \
         (most {}), owner RSS {} KiB at start, {} KiB at the end (most {} KiB)\n\
         chaos: restarts {}, turns adopted {}, unknown turns {} (from kills only: each \
         handoff's recovery lost 0), lost inputs 0, replayed work 0 (checked above)",
        began.elapsed().as_secs_f64(),
        drain_took.as_secs_f64(),
        s.sessions,
        s.submitted,
        book.inputs
            .values()
            .filter(|i| i.admission_id.is_some())
            .count(),
        book.inputs
            .values()
            .filter(|i| i.admission_id.is_some() && i.attempts > 1)
            .count(),
        s.resubmits,
        s.answers_lost_but_admitted,
        s.draining_refusals,
        s.cancels,
        s.cancel_races,
        s.interrupts,
        s.interrupt_races,
        s.disconnects,
        s.drops,
        outcomes.admissions,
        outcomes.completed,
        outcomes.resolved_unknown,
        s.resolves,
        outcomes.interrupted,
        outcomes.failed,
        outcomes.cancelled,
        outcomes.side_effects,
        requests.len(),
        c.worker_kills,
        c.mid_tool_kills,
        c.gated_kills,
        c.owner_kills,
        c.mid_submit_kills,
        c.killed_while_stopping,
        c.graceful_stops,
        c.gated_holds,
        chaos.orphans.len(),
        c.template_kills,
        c.spare_kills,
        c.worker_kills + c.owner_kills + c.template_kills + c.spare_kills,
        c.disk_full_windows,
        s.storage_refusals,
        churn_cycles,
        left_started,
        start_fds,
        end_fds,
        c.most_fds,
        start_rss,
        end_rss,
        c.most_rss_kib,
        c.restarts,
        c.adopted,
        outcomes.resolved_unknown,
    );

    if !bad.is_empty() {
        fail!(
            "{} broken guarantee(s):\n  - {}",
            bad.len(),
            bad.join("\n  - ")
        );
    }
    assert!(
        outcomes.completed > 0,
        "{} no turn completed: the chaos test tested nothing",
        replay_note()
    );
    *lock(&RUN) = None;
}
