//! Session control from the command line (SPEC section 8): `sessions`,
//! `show`, `resolve`, `cancel`, `answer` and `rename`. Each names its session by any unique
//! prefix of its id (an ambiguous one lists the candidates) and takes `--json`. Every call to
//! the daemon goes through [`drover_client`]; the few that need one are [`connect`] and the
//! `Client` methods it returns.
//!
//! None of these commands creates a home: on a home that does not exist they say so and exit 1
//! ([`require_home`]).

use crate::display::printable;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use drover_client::{Client, ClientError};
use drover_protocol::client::{
    AdmissionOutcome, AdmissionStatus, ApprovalChoice, ApprovalScope, ClarifyAnswer, OpenPrompt,
    PendingAdmission, PromptResponseStatus, SessionListParams, SessionPage, SessionSnapshot,
    SessionState, SessionSummary, TranscriptMessage, UsageGrouping, UsageReport, UsageReportParams,
    UsageSpend,
};
use drover_protocol::event::{EventPayload, SessionEvent};
use drover_protocol::{ClientRequest, Role};
use serde_json::{json, Value};

use crate::Exit;

/// Refuses a home that does not exist, before anything could create it: a mistyped `--home`
/// on a command that only reads or acts on existing sessions must not leave a new directory
/// (or a daemon) behind.
pub fn require_home(home: &Path) -> Result<()> {
    if home.is_dir() {
        return Ok(());
    }
    bail!(
        "no drover home at {}: nothing to read there (check --home or $DROVER_HOME; `drover run` creates a home)",
        home.display()
    )
}

/// Connects to the home's daemon ([`crate::commands::connect`]: starting one when none runs),
/// once the home exists.
async fn connect(home: &Path) -> Result<Client> {
    require_home(home)?;
    crate::commands::connect(home).await
}

/// The session `prefix` names, or an error listing the candidates of an ambiguous prefix.
async fn session(c: &Client, prefix: &str) -> Result<SessionSummary> {
    Ok(c.resolve_session(prefix).await?)
}

/// Prints `value` as pretty JSON on stdout.
fn print_json(value: &impl serde::Serialize) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Unix seconds now.
fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

pub use crate::display::ago;

/// A unix time as local `YYYY-MM-DD HH:MM`.
fn local_time(at: f64) -> String {
    chrono::DateTime::from_timestamp(at as i64, 0)
        .map(|t| {
            t.with_timezone(&chrono::Local)
                .format("%Y-%m-%d %H:%M")
                .to_string()
        })
        .unwrap_or_else(|| format!("{at}"))
}

/// A session's state in a person's words.
fn state_words(state: SessionState) -> &'static str {
    match state {
        SessionState::Idle => "idle",
        SessionState::Running => "running",
        SessionState::WaitingApproval => "waiting for approval",
        SessionState::WaitingClarify => "waiting for an answer",
        SessionState::PausedUnknown => "paused (unknown turn)",
        SessionState::PausedBudget => "paused (budget)",
    }
}

/// The shortest prefix length (at least 8) that tells every id of `ids` apart.
pub(crate) fn short_len(ids: &[&str]) -> usize {
    let mut len = 8;
    let mut sorted: Vec<&str> = ids.to_vec();
    sorted.sort_unstable();
    for pair in sorted.windows(2) {
        let common = pair[0]
            .chars()
            .zip(pair[1].chars())
            .take_while(|(a, b)| a == b)
            .count();
        len = len.max(common + 1);
    }
    len
}

/// The first `n` characters of `s`.
pub(crate) fn head(s: &str, n: usize) -> &str {
    s.char_indices().nth(n).map_or(s, |(i, _)| &s[..i])
}

/// One line of at most `max` characters: newlines shown as spaces, the rest cut with `…`.
pub(crate) fn one_line(s: &str, max: usize) -> String {
    let flat: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() <= max {
        flat
    } else {
        format!("{}…", head(&flat, max.saturating_sub(1)))
    }
}

// ---------------------------------------------------------------------------------------------
// drover sessions

/// `drover sessions [--json]`: the home's sessions, the most recently active first.
pub async fn sessions(home: &Path, as_json: bool) -> Result<Exit> {
    let c = connect(home).await?;
    let request = ClientRequest::SessionList(SessionListParams {
        limit: Some(1000),
        cursor: None,
        cwd: None,
    });
    if as_json {
        // As the daemon sent it (fields this build does not know included), once it reads as
        // a page.
        let raw = c.request_value(request.clone()).await?;
        drover_client::parse_result::<SessionPage>("session.list", raw.clone())?;
        print_json(&raw)?;
        return Ok(Exit::Ok);
    }
    let mut list: SessionPage = c.request(request).await?;
    if list.sessions.is_empty() {
        eprintln!(
            "drover: no sessions in {}; start one with `drover run PROMPT`",
            home.display()
        );
        return Ok(Exit::Ok);
    }
    list.sessions
        .sort_by(|a, b| b.last_activity_at.total_cmp(&a.last_activity_at));
    for line in session_table(&list.sessions, now()) {
        println!("{line}");
    }
    Ok(Exit::Ok)
}

/// What runs a session's turns, in a person's words: its external agent's name, or `drover`
/// (drover's own agent loop).
fn agent_words(agent: Option<&str>) -> &str {
    agent.unwrap_or("drover")
}

/// `drover sessions`' table, in the order given. The AGENT column is there only when a listed
/// session runs an external agent: a home without any reads as it always did.
fn session_table(sessions: &[SessionSummary], now: f64) -> Vec<String> {
    let ids: Vec<&str> = sessions.iter().map(|s| s.session_id.as_str()).collect();
    let width = short_len(&ids);
    let agents = sessions.iter().any(|s| s.agent.is_some()).then(|| {
        sessions
            .iter()
            .map(|s| agent_words(s.agent.as_deref()).chars().count().min(24))
            .fold("AGENT".len(), usize::max)
    });
    let agent_cell = |name: &str| match agents {
        Some(w) => format!("{:<w$}  ", one_line(name, w)),
        None => String::new(),
    };
    let mut lines = vec![format!(
        "{:<width$}  {:<16}  {:<9}  {:<21}  {:>5}  {}TITLE",
        "SESSION",
        "STARTED",
        "ACTIVE",
        "STATE",
        "QUEUE",
        agent_cell("AGENT")
    )];
    for s in sessions {
        let mut title = one_line(s.title.as_deref().unwrap_or_default(), 60);
        if s.source != "cli" {
            title = format!("[{}] {title}", s.source);
        }
        let row = format!(
            "{:<width$}  {:<16}  {:<9}  {:<21}  {:>5}  {}{title}",
            head(&s.session_id, width),
            local_time(s.started_at),
            ago(s.last_activity_at, now),
            state_words(s.state),
            s.pending_count,
            agent_cell(&printable(agent_words(s.agent.as_deref()))),
        );
        lines.push(row.trim_end().to_string());
        if let Some(error) = &s.error {
            lines.push(format!("{:<width$}  error: {error}", ""));
        }
    }
    lines
}

// ---------------------------------------------------------------------------------------------
// drover show

/// `drover show <id>` arguments.
#[derive(Args, Debug)]
pub struct ShowArgs {
    /// The session: its id, or any unique prefix of it.
    session: String,
    /// Print `{snapshot, events}`: the `session.resume` result and every stored event.
    #[arg(long)]
    json: bool,
}

/// Lines of a tool result `show` prints.
const RESULT_LINES: usize = 4;

/// Every stored event of the session, following `has_more`.
async fn stored_events(c: &Client, snapshot: &SessionSnapshot) -> Result<Vec<Value>> {
    let mut events = Vec::new();
    let mut last = 0;
    loop {
        let page = c
            .request_value(ClientRequest::SessionEventsSince(
                drover_protocol::client::EventsSinceParams {
                    session_id: snapshot.session_id.clone(),
                    replay_epoch: Some(snapshot.replay_epoch.clone()),
                    last_sequence: last,
                    limit: None,
                },
            ))
            .await?;
        let page: RawEventsPage = serde_path_to_error::deserialize(page).map_err(|e| {
            anyhow!(
                "session.events.since: the page does not parse at {}: {e}",
                e.path()
            )
        })?;
        last = page.last_sequence;
        events.extend(page.events);
        if !page.has_more {
            return Ok(events);
        }
    }
}

/// A `session.events.since` page whose events stay as the daemon sent them: `show --json`
/// prints them whole, and an event type this build does not know is skipped, not an error.
#[derive(serde::Deserialize)]
struct RawEventsPage {
    events: Vec<Value>,
    last_sequence: u64,
    has_more: bool,
}

/// What `show` knows of one admission from the stored events.
struct TurnLine {
    admission_id: String,
    status: AdmissionStatus,
    outcome: Option<AdmissionOutcome>,
    error: Option<String>,
}

/// The session's admissions in the order their events first name them, each with its last
/// status and outcome, and the error its turn settled with.
fn turns(events: &[SessionEvent]) -> Vec<TurnLine> {
    let mut out: Vec<TurnLine> = Vec::new();
    for e in events {
        let (id, status, outcome, error) = match &e.event {
            EventPayload::AdmissionUpdated(p) => (&p.admission_id, Some(p.status), p.outcome, None),
            EventPayload::TurnSettled(p) => (&p.admission_id, None, None, p.error.clone()),
            _ => continue,
        };
        let i = match out.iter().position(|t| &t.admission_id == id) {
            Some(i) => i,
            None => {
                out.push(TurnLine {
                    admission_id: id.clone(),
                    status: AdmissionStatus::Queued,
                    outcome: None,
                    error: None,
                });
                out.len() - 1
            }
        };
        if let Some(s) = status {
            out[i].status = s;
            out[i].outcome = outcome;
        }
        if error.is_some() {
            out[i].error = error;
        }
    }
    out
}

/// The transcript as a person reads it: user and assistant text, each tool call with the first
/// lines of its result.
fn print_transcript(messages: &[TranscriptMessage], events: &[SessionEvent]) {
    // `tool.start` carries each call's one-line preview (for `terminal`, the command).
    let context = |call_id: &str| {
        events.iter().find_map(|e| match &e.event {
            EventPayload::ToolStart(t) if t.tool_id == call_id => Some(t.context.clone()),
            _ => None,
        })
    };
    for m in messages {
        let text = m.content.as_deref().unwrap_or_default().trim_end();
        match m.role {
            Role::System => {}
            Role::User => println!("\nyou: {}", printable(text)),
            Role::Assistant => {
                if !text.is_empty() {
                    println!("\nassistant: {}", printable(text));
                }
                for call in m.tool_calls.iter().flatten() {
                    let preview = context(&call.id)
                        .unwrap_or_else(|| one_line(&call.function.arguments, 100));
                    println!("  [{}] {preview}", call.function.name);
                }
            }
            Role::Tool => {
                let shown = tool_result_text(text);
                let lines: Vec<&str> = shown.lines().collect();
                for line in lines.iter().take(RESULT_LINES) {
                    println!("    {}", one_line(line, 120));
                }
                if lines.len() > RESULT_LINES {
                    println!("    … {} more lines", lines.len() - RESULT_LINES);
                }
            }
        }
    }
}

/// What a person reads of a tool's result: a JSON result's `output` (or `content`), with its
/// `error` and a non-zero `exit_code` first; any other result as it is.
fn tool_result_text(text: &str) -> String {
    let Ok(Value::Object(result)) = serde_json::from_str::<Value>(text) else {
        return text.to_string();
    };
    let mut out = String::new();
    if let Some(error) = result.get("error").and_then(Value::as_str) {
        out.push_str(&format!("error: {error}\n"));
    }
    if let Some(code) = result
        .get("exit_code")
        .and_then(Value::as_i64)
        .filter(|c| *c != 0)
    {
        out.push_str(&format!("exit code {code}\n"));
    }
    match ["output", "content"]
        .iter()
        .find_map(|k| result.get(*k).and_then(Value::as_str))
    {
        Some(body) => out.push_str(body),
        None if out.is_empty() => out.push_str(text),
        None => {}
    }
    out
}

/// The word of an admission's outcome, or its status while not terminal.
fn admission_word(status: AdmissionStatus, outcome: Option<AdmissionOutcome>) -> String {
    let word = match (status, outcome) {
        (AdmissionStatus::Terminal, Some(o)) => serde_json::to_value(o),
        (s, _) => serde_json::to_value(s),
    };
    word.ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// `drover show`'s line on what runs the session and where.
fn settings_line(info: &drover_protocol::client::SessionInfo, summary: &SessionSummary) -> String {
    format!(
        "agent {}  model {}  cwd {}  started {}  {}",
        printable(agent_words(info.agent.as_deref())),
        info.model,
        info.cwd,
        local_time(summary.started_at),
        state_words(summary.state)
    )
}

/// `drover show`'s one line on what confines the session's tools.
fn confinement_line(c: &drover_protocol::sandbox::Confinement) -> String {
    let mut line = format!(
        "sandbox {}  home {}  network {}",
        c.sandbox,
        if c.home_hidden { "hidden" } else { "visible" },
        c.network
    );
    if let Some(abi) = c.landlock_abi {
        line.push_str(&format!("  landlock ABI {abi}"));
    }
    if c.required {
        line.push_str("  required");
    }
    if !c.problems.is_empty() {
        line.push_str(&format!("  ({})", c.problems.join("; ")));
    }
    line
}

/// What each turn of session `sid` and of the sessions it delegated to spent (`usage.report`
/// by turn); `None` from a daemon without that method (its lines just show no cost).
async fn turn_spend(c: &Client, sid: &str) -> Option<UsageReport> {
    let request = ClientRequest::UsageReport(UsageReportParams {
        by: Some(UsageGrouping::Turn),
        since: None,
        session_id: Some(sid.to_string()),
    });
    c.request(request).await.ok()
}

/// The end of `show`'s usage line: the session's cost when known (`*`: some turns had no
/// price), and what the sessions it delegated to spent, when they did.
fn spend_words(report: &UsageReport, sid: &str) -> String {
    let mut own = UsageSpend::default();
    let mut delegated = UsageSpend::default();
    for g in &report.groups {
        let sum = if g.session_id.as_deref() == Some(sid) {
            &mut own
        } else {
            &mut delegated
        };
        sum.total_tokens += g.spend.total_tokens;
        sum.executions += g.spend.executions;
        sum.unpriced_executions += g.spend.unpriced_executions;
        if let Some(usd) = g.spend.cost_usd {
            sum.cost_usd = Some(sum.cost_usd.unwrap_or(0.0) + usd);
        }
    }
    let cost = |s: &UsageSpend| match s.cost_usd {
        Some(usd) if s.unpriced_executions > 0 => {
            format!(
                ", cost {}* (some turns had no price)",
                crate::display::dollars(usd)
            )
        }
        Some(usd) => format!(", cost {}", crate::display::dollars(usd)),
        None => String::new(),
    };
    let mut words = cost(&own);
    if delegated.executions > 0 {
        words.push_str(&format!(
            "; delegated sessions {} tokens{}",
            delegated.total_tokens,
            cost(&delegated)
        ));
    }
    words
}

pub async fn show(home: &Path, args: ShowArgs) -> Result<Exit> {
    let c = connect(home).await?;
    let summary = session(&c, &args.session).await?;
    let sid = summary.session_id.clone();
    let raw = c
        .request_value(ClientRequest::SessionResume(
            drover_protocol::client::SessionRef {
                session_id: sid.clone(),
            },
        ))
        .await?;
    let snapshot: SessionSnapshot =
        serde_json::from_value(raw.clone()).context("session.resume: the result does not parse")?;
    let events = stored_events(&c, &snapshot).await?;
    // Reading is not following: leave the session's events to the clients that want them.
    let _ = c.detach(&sid).await;
    if args.json {
        print_json(&json!({"snapshot": raw, "events": events}))?;
        return Ok(Exit::Ok);
    }
    let typed: Vec<SessionEvent> = events
        .iter()
        .filter_map(|e| serde_json::from_value(e.clone()).ok())
        .collect();
    let info = &snapshot.info;
    println!(
        "session {sid}{}",
        info.title
            .as_deref()
            .map(|t| format!("  \"{}\"", printable(t)))
            .unwrap_or_default()
    );
    println!("{}", settings_line(info, &summary));
    if let Some(confinement) = &info.confinement {
        println!("{}", confinement_line(confinement));
    }
    print_transcript(&snapshot.messages, &typed);
    let turns = turns(&typed);
    if !turns.is_empty() {
        println!("\nturns:");
    }
    let spend = turn_spend(&c, &sid).await;
    let (mut input, mut output, mut total) = (0u64, 0u64, 0u64);
    for t in &turns {
        let mut line = format!(
            "  {}  {:<11}",
            head(&t.admission_id, 8),
            admission_word(t.status, t.outcome)
        );
        if t.status == AdmissionStatus::Terminal {
            let r = c.receipt(&sid, &t.admission_id, true).await?;
            if let Some(u) = r.usage {
                line.push_str(&format!(
                    "  {} in / {} out tokens",
                    u.input_tokens, u.output_tokens
                ));
                input += u.input_tokens;
                output += u.output_tokens;
                total += u.total_tokens;
            }
            if let Some(cost) = spend
                .as_ref()
                .and_then(|r| r.groups.iter().find(|g| g.key == t.admission_id))
                .and_then(|g| g.spend.cost_usd)
            {
                line.push_str(&format!("  {}", crate::display::dollars(cost)));
            }
        } else if let Some(g) = spend
            .as_ref()
            .and_then(|r| r.groups.iter().find(|g| g.key == t.admission_id))
            .filter(|g| g.spend.total_tokens > 0 || g.spend.cost_usd.is_some())
        {
            // A turn still running (or paused) has no receipt yet, but its requests are
            // counted and priced: its tokens so far go with its cost, so the totals agree.
            line.push_str(&format!(
                "  {} in / {} out tokens so far",
                g.spend.input_tokens, g.spend.output_tokens
            ));
            if let Some(cost) = g.spend.cost_usd {
                line.push_str(&format!("  {}", crate::display::dollars(cost)));
            }
            input += g.spend.input_tokens;
            output += g.spend.output_tokens;
            total += g.spend.total_tokens;
        }
        if let Some(p) = snapshot
            .pending
            .iter()
            .find(|p| p.admission_id == t.admission_id)
        {
            if p.kind == drover_protocol::client::AdmissionKind::Compact {
                line.push_str("  (a compaction: session.compact)");
            } else {
                line.push_str(&format!("  \"{}\"", one_line(&p.text, 60)));
            }
        }
        if let Some(e) = &t.error {
            line.push_str(&format!("  error: {}", one_line(e, 100)));
        }
        println!("{line}");
    }
    println!(
        "usage: {input} input + {output} output = {total} tokens{}",
        spend
            .as_ref()
            .map(|r| spend_words(r, &sid))
            .unwrap_or_default()
    );
    for p in &snapshot.prompts {
        match p {
            OpenPrompt::Approval(a) => {
                println!(
                    "waiting for approval: `{}` ({}); `drover answer {} --choice once|session|always|deny`",
                    printable(&a.command),
                    a.description,
                    head(&sid, 8)
                );
                // Where an `always` answer may apply, in the words it would be stored with.
                for offer in &a.scopes {
                    println!("  always --scope {}: {}", offer.scope, offer.text);
                }
            }
            OpenPrompt::Clarify(q) => println!(
                "waiting for an answer: {}; `drover answer {} --text ...`",
                printable(&q.question),
                head(&sid, 8)
            ),
            OpenPrompt::Budget(b) => println!(
                "paused (budget): {:.4} USD, {} tokens spent of {} ({} limit); `drover budget {} {}` raises it and the turn goes on, `--stop` ends the turn",
                b.spent_usd,
                b.spent_tokens,
                limit_words(b.limit_usd, b.limit_tokens),
                b.scope,
                head(&sid, 8),
                raise_flag(b)
            ),
        }
    }
    if snapshot
        .pending
        .iter()
        .any(|p| p.status == AdmissionStatus::Unknown)
    {
        println!(
            "paused: a turn's outcome is unknown; `drover resolve {}` lets the queue go on",
            head(&sid, 8)
        );
    }
    Ok(Exit::Ok)
}

// ---------------------------------------------------------------------------------------------
// drover resolve

/// `drover resolve <id>` arguments.
#[derive(Args, Debug)]
pub struct ResolveArgs {
    /// The session: its id, or any unique prefix of it.
    session: String,
    /// Print `{session_id, resolved: [{admission, receipt}]}`.
    #[arg(long)]
    json: bool,
}

/// `drover resolve`: closes the session's `unknown` turn as `interrupted`, so its queue moves on.
pub async fn resolve(home: &Path, args: ResolveArgs) -> Result<Exit> {
    let c = connect(home).await?;
    let sid = session(&c, &args.session).await?.session_id;
    let snapshot = c.resume(&sid).await?;
    let unknown: Vec<&PendingAdmission> = snapshot
        .pending
        .iter()
        .filter(|p| p.status == AdmissionStatus::Unknown)
        .collect();
    let mut resolved = Vec::new();
    if unknown.is_empty() && !args.json {
        println!("nothing to resolve: no turn of session {sid} has an unknown outcome");
    }
    let now = now();
    for p in unknown {
        let receipt = c.resolve_unknown(&sid, &p.admission_id).await?;
        if !args.json {
            let when = p
                .started_at
                .or(p.admitted_at)
                .map_or_else(String::new, |t| {
                    format!(" (started {}, {})", local_time(t), ago(t, now))
                });
            println!(
                "resolved the turn of admission {}{when}: \"{}\"",
                p.admission_id,
                one_line(&p.text, 100)
            );
            println!(
                "its worker or the daemon died while it ran, so what it did is not known; it is \
                 now interrupted and will not run again. `drover show {}` shows what it left in \
                 the transcript.",
                head(&sid, 8)
            );
        }
        resolved.push(json!({"admission": p, "receipt": receipt}));
    }
    if args.json {
        print_json(&json!({"session_id": sid, "resolved": resolved}))?;
    }
    Ok(Exit::Ok)
}

// ---------------------------------------------------------------------------------------------
// drover cancel

/// `drover cancel <id> [<admission>]` arguments.
#[derive(Args, Debug)]
pub struct CancelArgs {
    /// The session: its id, or any unique prefix of it.
    session: String,
    /// The admission to cancel (any unique prefix); default: every queued input.
    admission: Option<String>,
    /// Print `{session_id, cancelled: [receipt], refused: [{admission_id, status, reason}],
    /// running}` (`running`: the running turn's admission, or null).
    #[arg(long)]
    json: bool,
}

/// Why `pending` cannot be cancelled, and what to do instead; `None` when it is queued.
fn not_cancellable(p: &PendingAdmission, sid: &str) -> Option<String> {
    match p.status {
        AdmissionStatus::Queued | AdmissionStatus::Terminal => None,
        AdmissionStatus::Started => Some(format!(
            "admission {} has started, so it cannot be cancelled; `drover interrupt {}` stops \
             its turn",
            p.admission_id,
            head(sid, 8)
        )),
        AdmissionStatus::Unknown => Some(format!(
            "admission {} has an unknown outcome, so it cannot be cancelled; `drover resolve {}` \
             closes it",
            p.admission_id,
            head(sid, 8)
        )),
    }
}

/// `drover cancel`.
pub async fn cancel(home: &Path, args: CancelArgs) -> Result<Exit> {
    let c = connect(home).await?;
    let sid = session(&c, &args.session).await?.session_id;
    let snapshot = c.resume(&sid).await?;
    // Without a name only the queued inputs are meant: the running turn goes on (`drover
    // interrupt` stops it) and an unknown one waits for `drover resolve`.
    let running = snapshot
        .pending
        .iter()
        .find(|p| p.status == AdmissionStatus::Started);
    let targets: Vec<&PendingAdmission> = match &args.admission {
        None => snapshot
            .pending
            .iter()
            .filter(|p| p.status == AdmissionStatus::Queued)
            .collect(),
        Some(prefix) => {
            let matching: Vec<&PendingAdmission> = snapshot
                .pending
                .iter()
                .filter(|p| p.admission_id.starts_with(prefix.as_str()))
                .collect();
            match matching.len() {
                0 => {
                    // A terminal admission is not pending; its receipt says how it ended.
                    return match c.receipt(&sid, prefix, false).await {
                        Ok(r) => {
                            let word = admission_word(r.status, r.outcome);
                            if args.json {
                                print_json(
                                    &json!({"session_id": sid, "cancelled": [], "refused": [], "finished": [r]}),
                                )?;
                            } else {
                                println!("admission {prefix} already ended: {word}");
                            }
                            Ok(if r.outcome == Some(AdmissionOutcome::Cancelled) {
                                Exit::Ok
                            } else {
                                Exit::Failed
                            })
                        }
                        Err(e) if e.reason() == Some("not_found") => bail!(
                            "no waiting admission {prefix} in session {sid} (`drover show {}` lists its turns)",
                            head(&sid, 8)
                        ),
                        Err(e) => Err(e.into()),
                    };
                }
                1 => matching,
                _ => bail!(
                    "{prefix} names {} admissions of session {sid}: {}; give more of the id",
                    matching.len(),
                    matching
                        .iter()
                        .map(|p| p.admission_id.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }
        }
    };
    let (mut cancelled, mut refused) = (Vec::new(), Vec::new());
    for p in &targets {
        if let Some(why) = not_cancellable(p, &sid) {
            if !args.json {
                eprintln!("drover: {why}");
            }
            refused
                .push(json!({"admission_id": p.admission_id, "status": p.status, "reason": why}));
            continue;
        }
        match c.cancel(&sid, &p.admission_id).await {
            Ok(r) => {
                if !args.json {
                    println!(
                        "cancelled admission {}: \"{}\"",
                        p.admission_id,
                        one_line(&p.text, 80)
                    );
                }
                cancelled.push(r);
            }
            // It started between the snapshot and the cancel.
            Err(e) if e.reason() == Some("stale_generation") => {
                let why = format!(
                    "admission {} started before it could be cancelled; `drover interrupt {}` stops its turn",
                    p.admission_id,
                    head(&sid, 8)
                );
                if !args.json {
                    eprintln!("drover: {why}");
                }
                refused.push(
                    json!({"admission_id": p.admission_id, "status": "started", "reason": why}),
                );
            }
            Err(e) => return Err(e.into()),
        }
    }
    if args.json {
        let running = running.map(|p| p.admission_id.as_str());
        print_json(
            &json!({"session_id": sid, "cancelled": cancelled, "refused": refused, "running": running}),
        )?;
    } else if targets.is_empty() {
        println!("nothing is queued in session {sid}");
    } else if args.admission.is_none() {
        let n = cancelled.len();
        println!(
            "cancelled {n} queued input{} of session {sid}",
            if n == 1 { "" } else { "s" }
        );
    }
    if let (None, false, Some(p)) = (&args.admission, args.json, running) {
        println!(
            "turn {} is still running (`drover interrupt {}` stops it)",
            p.admission_id,
            head(&sid, 8)
        );
    }
    // A named admission that could not be cancelled is a failure; "all queued" is done when
    // every queued one is.
    Ok(if args.admission.is_some() && !refused.is_empty() {
        Exit::Failed
    } else {
        Exit::Ok
    })
}

// ---------------------------------------------------------------------------------------------
// drover answer

/// `drover answer <id> (--choice C | --text T)` arguments.
#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("reply").required(true).args(["choice", "text"])))]
pub struct AnswerArgs {
    /// The session: its id, or any unique prefix of it.
    session: String,
    /// The answer to an approval prompt.
    #[arg(long, value_parser = ["once", "session", "always", "deny"])]
    choice: Option<String>,
    /// The answer to a clarify question (one of its choices, or free text; several choices of
    /// a multi-select question separated by commas).
    #[arg(long, value_name = "TEXT")]
    text: Option<String>,
    /// Where an `always` answer's rule applies: one of the prompt's scopes (default:
    /// `workspace` when the prompt offers it, else its narrowest).
    #[arg(long, value_parser = ["directory", "workspace", "everywhere"], requires = "choice")]
    scope: Option<String>,
    /// Print `{session_id, prompt, response}` (and `always_covers`, the stored rule's words,
    /// for `--choice always`).
    #[arg(long)]
    json: bool,
}

/// `drover answer`: answers the session's oldest open prompt.
pub async fn answer(home: &Path, args: AnswerArgs) -> Result<Exit> {
    let c = connect(home).await?;
    let sid = session(&c, &args.session).await?.session_id;
    let snapshot = c.resume(&sid).await?;
    let Some(prompt) = snapshot.prompts.first() else {
        bail!("no prompt waits for an answer in session {sid}");
    };
    // What an `always` answer stored: its rule's words.
    let mut covers: Option<String> = None;
    let response = match (prompt, &args.choice, &args.text) {
        (OpenPrompt::Approval(p), Some(choice), _) => {
            let choice: ApprovalChoice = serde_json::from_value(Value::String(choice.clone()))
                .context("--choice")?;
            if !p.choices.contains(&choice) {
                bail!(
                    "--choice {}: this prompt offers {}",
                    args.choice.as_deref().unwrap_or_default(),
                    p.choices
                        .iter()
                        .filter_map(|c| serde_json::to_value(c).ok())
                        .filter_map(|v| v.as_str().map(str::to_string))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            let scope = match (&args.scope, choice) {
                (None, _) => None,
                (Some(word), ApprovalChoice::Always) => {
                    let scope = ApprovalScope::parse(word)
                        .ok_or_else(|| anyhow!("--scope {word}: not a scope"))?;
                    let offered = p.offered_scopes();
                    if !offered.contains(&scope) {
                        bail!(
                            "--scope {word}: this prompt offers {}",
                            offered
                                .iter()
                                .map(|s| s.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        );
                    }
                    Some(scope)
                }
                (Some(_), _) => bail!("--scope goes only with --choice always"),
            };
            if !args.json {
                println!(
                    "approving `{}` ({}): {}",
                    printable(&p.command),
                    p.description,
                    args.choice.as_deref().unwrap_or_default()
                );
            }
            c.respond_approval_scoped(&sid, p.execution_generation, &p.prompt_id, choice, scope)
                .await
        }
        (OpenPrompt::Clarify(q), _, Some(text)) => {
            let answer = if q.multi_select {
                ClarifyAnswer::Choices(text.split(',').map(|s| s.trim().to_string()).collect())
            } else {
                ClarifyAnswer::Text(text.clone())
            };
            let picked: Vec<&str> = match &answer {
                ClarifyAnswer::Text(t) => vec![t.as_str()],
                ClarifyAnswer::Choices(items) => items.iter().map(String::as_str).collect(),
            };
            if let Some(bad) = picked
                .iter()
                .find(|a| !q.choices.is_empty() && !q.choices.iter().any(|c| c == *a))
            {
                bail!(
                    "--text {bad:?} is not one of the question's choices: {}",
                    q.choices.join(", ")
                );
            }
            if !args.json {
                println!("answering \"{}\": {text}", printable(&q.question));
            }
            c.respond_clarify(&sid, q.execution_generation, &q.prompt_id, answer)
                .await
        }
        (OpenPrompt::Approval(p), None, _) => bail!(
            "the waiting prompt is an approval of `{}`; answer it with --choice once|session|always|deny",
            printable(&p.command)
        ),
        (OpenPrompt::Clarify(q), _, None) => bail!(
            "the waiting prompt is a question (\"{}\"); answer it with --text TEXT",
            q.question
        ),
        (OpenPrompt::Budget(b), _, _) => bail!(
            "the turn is paused by a spend limit; raise it with `drover budget {sid} {}`, \
             or stop the turn with `drover budget {sid} --stop`",
            raise_flag(b)
        ),
    };
    let response = match response {
        Ok(r) => r,
        Err(e @ ClientError::Rpc { .. }) if e.reason() == Some("stale_generation") => {
            bail!("the prompt's turn has ended; nothing to answer")
        }
        Err(e) => return Err(e.into()),
    };
    // What the `always` answer stored, in the words its prompt offered it with.
    if let Some(rule) = &response.stored_rule {
        covers = Some(rule.text.clone());
        if !args.json {
            println!(
                "stored: always allow {}; `drover approvals rm {}` removes it",
                rule.text,
                rule.rule_id.get(..8).unwrap_or(&rule.rule_id)
            );
        }
    }
    if args.json {
        let mut out = json!({"session_id": sid, "prompt": prompt, "response": response});
        if let Some(covers) = covers {
            out["always_covers"] = Value::String(covers);
        }
        print_json(&out)?;
    }
    Ok(match response.status {
        PromptResponseStatus::Resolved => Exit::Ok,
        PromptResponseStatus::AlreadyResolved => {
            if !args.json {
                eprintln!("drover: another answer (or an interrupt) got there first; yours was not recorded");
            }
            Exit::Failed
        }
        PromptResponseStatus::Cancelled => {
            if !args.json {
                let why = response.reason.as_deref().unwrap_or("stopped");
                eprintln!("drover: the prompt was closed unanswered (its turn {why}); nothing was recorded");
            }
            Exit::Failed
        }
    })
}

// ---------------------------------------------------------------------------------------------
// drover rename

/// `drover rename <id> TITLE` arguments.
#[derive(Args, Debug)]
pub struct RenameArgs {
    /// The session: its id, or any unique prefix of it.
    session: String,
    /// The new title (1 to 200 characters).
    title: String,
    /// Print the `session.rename` result `{session_id, title}`.
    #[arg(long)]
    json: bool,
}

/// `drover rename`.
pub async fn rename(home: &Path, args: RenameArgs) -> Result<Exit> {
    let c = connect(home).await?;
    let sid = session(&c, &args.session).await?.session_id;
    let renamed = c.rename(&sid, &args.title).await?;
    if args.json {
        print_json(&renamed)?;
    } else {
        println!(
            "session {} is now \"{}\"",
            renamed.session_id, renamed.title
        );
    }
    Ok(Exit::Ok)
}

/// A budget's limits in words: "1.0000 USD", "5000 tokens", both, or "no limit".
/// The `drover budget` option that raises the limit a paused turn's next request passes:
/// tokens when only its token limit is passed (a USD raise would leave it paused).
pub(crate) fn raise_flag(b: &drover_protocol::client::BudgetPrompt) -> &'static str {
    if b.token_limit_reached() {
        "--add-tokens N"
    } else {
        "--add-usd N"
    }
}

pub(crate) fn limit_words(usd: Option<f64>, tokens: Option<u64>) -> String {
    match (usd, tokens) {
        (Some(usd), Some(tokens)) => format!("{usd:.4} USD / {tokens} tokens"),
        (Some(usd), None) => format!("{usd:.4} USD"),
        (None, Some(tokens)) => format!("{tokens} tokens"),
        (None, None) => "no limit".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ago_reads_in_the_largest_whole_unit() {
        let now = 1_000_000.0;
        assert_eq!(ago(now - 3.0, now), "just now");
        assert_eq!(ago(now - 42.0, now), "42s ago");
        assert_eq!(ago(now - 180.0, now), "3m ago");
        assert_eq!(ago(now - 7_300.0, now), "2h ago");
        assert_eq!(ago(now - 3.0 * 86_400.0, now), "3d ago");
        // A clock that went back is "just now", not a negative age.
        assert_eq!(ago(now + 50.0, now), "just now");
    }

    #[test]
    fn short_ids_are_long_enough_to_tell_every_listed_session_apart() {
        assert_eq!(short_len(&["aaaaaaaa11", "bbbbbbbb22"]), 8);
        assert_eq!(short_len(&["abcdefgh1x", "abcdefgh2y"]), 9);
        assert_eq!(short_len(&[]), 8);
    }

    #[test]
    fn a_json_tool_result_shows_its_output_and_what_went_wrong() {
        assert_eq!(
            tool_result_text(r#"{"error":null,"exit_code":0,"output":"a\nb"}"#),
            "a\nb"
        );
        assert_eq!(
            tool_result_text(r#"{"error":"boom","exit_code":2,"output":""}"#),
            "error: boom\nexit code 2\n"
        );
        assert_eq!(tool_result_text("plain text"), "plain text");
        assert_eq!(tool_result_text(r#"{"ok":true}"#), r#"{"ok":true}"#);
    }

    fn summary(id: &str, agent: Option<&str>) -> SessionSummary {
        serde_json::from_value(json!({
            "session_id": id, "title": "t", "source": "cli", "parent_session_id": null,
            "model": "m", "started_at": 1.0, "ended_at": null, "running": false,
            "pending_count": 0, "state": "idle", "last_activity_at": 1.0, "agent": agent,
        }))
        .unwrap()
    }

    #[test]
    fn the_session_table_has_an_agent_column_only_when_a_session_runs_one() {
        let own = [summary("aaaaaaaa1", None), summary("bbbbbbbb2", None)];
        let table = session_table(&own, 2.0);
        assert!(!table[0].contains("AGENT"), "{table:?}");
        assert!(table.iter().all(|l| !l.contains("drover")), "{table:?}");

        let mixed = [
            summary("aaaaaaaa1", Some("codex")),
            summary("bbbbbbbb2", None),
        ];
        let table = session_table(&mixed, 2.0);
        assert!(table[0].contains("  AGENT   TITLE"), "{table:?}");
        assert!(
            table[1].starts_with("aaaaaaaa") && table[1].ends_with("  codex   t"),
            "{table:?}"
        );
        assert!(table[2].ends_with("  drover  t"), "{table:?}");
        // The columns line up: TITLE starts where each row's title does.
        let at = table[0].find("TITLE").unwrap();
        assert_eq!(table[1].rfind(" t").unwrap() + 1, at, "{table:?}");
        assert_eq!(table[2].rfind(" t").unwrap() + 1, at, "{table:?}");
    }

    #[test]
    fn show_names_the_agent_or_drover() {
        let info = |agent: Option<&str>| -> drover_protocol::client::SessionInfo {
            serde_json::from_value(json!({
                "model": "m", "cwd": "/w", "source": "cli", "toolsets": [], "title": null,
                "agent": agent,
            }))
            .unwrap()
        };
        let s = summary("aaaaaaaa1", None);
        assert!(settings_line(&info(Some("codex")), &s).starts_with("agent codex  model m  cwd /w"));
        assert!(settings_line(&info(None), &s).starts_with("agent drover  model m"));
    }

    #[test]
    fn one_line_flattens_and_cuts() {
        assert_eq!(one_line("a\nb", 10), "a b");
        assert_eq!(one_line("abcdef", 4), "abc…");
        assert_eq!(one_line("éééé", 4), "éééé");
    }
}
