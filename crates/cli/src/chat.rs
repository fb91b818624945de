//! `drover chat` and `drover attach` (SPEC section 8): the interactive client of
//! [`drover_tui`], linked to the daemon through [`drover_client`]. This module implements the
//! TUI's [`Link`] and [`Events`] over a [`Client`], and follows the child agents of a running
//! `delegate_task` so their tool calls show nested under it.

use std::collections::HashSet;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use async_trait::async_trait;
use clap::Args;
use drover_client::{
    Client, ClientError, ConnectOptions, ConnectionChange, SessionStream, StartDaemon, Update,
};
use drover_protocol::client::{
    AdmissionStatus, ApprovalChoice, ApprovalRule, ApprovalRules, BudgetRaiseParams,
    BudgetRespondParams, BudgetStatus, BudgetStatusParams, CompactionResult, NoParams,
    PromptResponse, SessionCreateParams, SessionSnapshot, SessionSummary, UsageGrouping,
    UsageReport, UsageReportParams,
};
use drover_protocol::event::{EventPayload, SessionEvent};
use drover_protocol::ClientRequest;
use drover_tui::{
    Events, Link, LinkError, LinkUpdate, Opened, PromptAnswer, Reply, SessionSpend, Target, Theme,
};
use tokio::sync::mpsc;

use crate::Exit;

/// `drover chat` arguments.
#[derive(Args, Debug, Default)]
pub struct ChatArgs {
    /// Continue the home's most recent session.
    #[arg(short = 'c', long = "continue", conflicts_with = "session")]
    continue_: bool,
    /// Open this session (an id or a unique prefix).
    #[arg(long, value_name = "ID")]
    session: Option<String>,
    /// New sessions of this chat (the first, and `/new`) run this external agent, a name of
    /// `[agents.<name>]` in config.toml, instead of drover's own agent loop.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["session", "continue_"])]
    agent: Option<String>,
    /// New sessions of this chat use this model (default: `[model] name`): with
    /// `--base-url`, a chat needs no config.toml.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["session", "continue_", "agent"])]
    model: Option<String>,
    /// New sessions of this chat use this endpoint (default: `[model] base_url`, else
    /// `$OPENAI_BASE_URL`).
    #[arg(long, value_name = "URL", conflicts_with_all = ["session", "continue_", "agent"])]
    base_url: Option<String>,
}

/// `drover attach` arguments.
#[derive(Args, Debug)]
pub struct AttachArgs {
    /// The session: an id or a unique prefix.
    session: String,
}

impl ChatArgs {
    /// A new session's chat, its sessions on `model` at `base_url` (`drover --model M`).
    pub fn new_session_on(model: Option<String>, base_url: Option<String>) -> ChatArgs {
        ChatArgs {
            model,
            base_url,
            ..ChatArgs::default()
        }
    }

    fn target(&self) -> Target {
        match (&self.session, self.continue_) {
            (Some(id), _) => Target::Session(id.clone()),
            (None, true) => Target::Continue,
            (None, false) => Target::New,
        }
    }
}

/// Whether stdin and stdout are both terminals (`drover` alone then opens the chat).
pub fn on_a_terminal() -> bool {
    std::io::stdin().is_terminal() && std::io::stdout().is_terminal()
}

/// `drover chat`.
pub async fn chat(home: PathBuf, args: ChatArgs) -> Result<Exit> {
    if args.model.as_deref().is_some_and(|m| m.trim().is_empty()) {
        anyhow::bail!("--model must name a model, not be empty");
    }
    if let Some(url) = &args.base_url {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            anyhow::bail!("--base-url must be an http:// or https:// URL, not {url:?}");
        }
    }
    let target = args.target();
    let new_sessions = NewSessions {
        agent: args.agent,
        model: args.model,
        base_url: args.base_url,
    };
    open(home, target, new_sessions).await
}

/// What the sessions a chat creates are made with (`drover chat --agent`, `--model`,
/// `--base-url`); all `None`: the config's.
#[derive(Debug, Default)]
struct NewSessions {
    agent: Option<String>,
    model: Option<String>,
    base_url: Option<String>,
}

/// `drover attach ID`.
pub async fn attach(home: PathBuf, args: AttachArgs) -> Result<Exit> {
    if !home.is_dir() {
        eprintln!(
            "drover: there is no drover home at {} (nothing to attach to)",
            home.display()
        );
        return Ok(Exit::Failed);
    }
    open(home, Target::Session(args.session), NewSessions::default()).await
}

/// Opens the chat on `target`; the sessions it creates are made as `new_sessions` says.
async fn open(home: PathBuf, target: Target, new_sessions: NewSessions) -> Result<Exit> {
    if !on_a_terminal() {
        eprintln!(
            "drover: chat needs a terminal (stdin and stdout); from a script use `drover run PROMPT` (or `drover run -` to read it from stdin)"
        );
        return Ok(Exit::Failed);
    }
    let program = std::env::current_exe()?;
    // A person may take a while to fix what keeps the daemon from starting again.
    let mut options = ConnectOptions::new(&home, StartDaemon::Spawn { program });
    options.reconnect_for = CHAT_RECONNECT_FOR;
    let client = match Client::connect(options).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("drover: {e}");
            return Ok(Exit::Failed);
        }
    };
    if let Some(mismatch) = client.api_key_mismatch() {
        eprintln!("drover: {mismatch}");
    }
    let cwd = std::env::current_dir()?.display().to_string();
    let link = Arc::new(ClientLink {
        client,
        cwd,
        new_sessions,
    });
    match drover_tui::run(link, target, Theme::from_env()).await {
        Ok(_) => Ok(Exit::Ok),
        Err(e) => {
            eprintln!("drover: {e}");
            Ok(Exit::Failed)
        }
    }
}

/// The TUI's [`Link`] over a [`Client`].
struct ClientLink {
    client: Client,
    /// The working directory new sessions get.
    cwd: String,
    /// What new sessions are made with (`drover chat --agent`, `--model`, `--base-url`).
    new_sessions: NewSessions,
}

fn words(e: ClientError) -> LinkError {
    LinkError(e.to_string())
}

#[async_trait]
impl Link for ClientLink {
    async fn open(&self, target: Target) -> Result<(Opened, Box<dyn Events>), LinkError> {
        let stream = match target {
            Target::New => self.create().await?,
            Target::Continue => match self.client.most_recent_session().await {
                Ok(s) => self.attach(&s.session_id).await?,
                Err(ClientError::NoSessions { .. }) => self.create().await?,
                Err(e) => return Err(words(e)),
            },
            Target::Session(prefix) => {
                let found = self.client.resolve_session(&prefix).await.map_err(words)?;
                self.attach(&found.session_id).await?
            }
        };
        let session_id = stream.session_id().to_string();
        let snapshot = stream.snapshot().clone();
        let (history, running_events) = self.stored_events(&snapshot).await?;
        // Opened in the middle of a `delegate_task` (attach): its children are followed from
        // the start, as they would have been from its `tool.start`.
        let delegating = running_events
            .iter()
            .any(|e| matches!(&e.event, EventPayload::ToolStart(t) if t.name == DELEGATE_TASK));
        let (tx, rx) = mpsc::unbounded_channel();
        let pump = tokio::spawn(pump(
            self.client.clone(),
            session_id,
            stream,
            delegating,
            tx,
        ));
        let events = ClientEvents { rx, pump };
        Ok((
            Opened {
                snapshot,
                running_events,
                history,
            },
            Box::new(events),
        ))
    }

    async fn submit(&self, session_id: &str, text: &str) -> Result<String, LinkError> {
        let receipt = self.client.submit(session_id, text).await.map_err(words)?;
        Ok(receipt.admission_id)
    }

    async fn compact(&self, session_id: &str) -> Result<CompactionResult, LinkError> {
        self.client.compact(session_id).await.map_err(words)
    }

    async fn interrupt(&self, session_id: &str, generation: u64) -> Result<(), LinkError> {
        self.client
            .interrupt(session_id, generation)
            .await
            .map(drop)
            .map_err(words)
    }

    async fn answer(
        &self,
        session_id: &str,
        answer: PromptAnswer,
    ) -> Result<PromptResponse, LinkError> {
        let PromptAnswer {
            prompt_id,
            generation,
            reply,
        } = answer;
        let (client, prompt_id) = (&self.client, prompt_id.as_str());
        match reply {
            Reply::Approval(choice) => {
                client
                    .respond_approval(session_id, generation, prompt_id, choice)
                    .await
            }
            Reply::Always(scope) => {
                client
                    .respond_approval_scoped(
                        session_id,
                        generation,
                        prompt_id,
                        ApprovalChoice::Always,
                        scope,
                    )
                    .await
            }
            Reply::Clarify(answer) => {
                client
                    .respond_clarify(session_id, generation, prompt_id, answer)
                    .await
            }
            Reply::Budget {
                choice,
                add_usd,
                add_tokens,
            } => {
                client
                    .request::<PromptResponse>(ClientRequest::BudgetRespond(BudgetRespondParams {
                        session_id: session_id.to_string(),
                        execution_generation: generation,
                        prompt_id: prompt_id.to_string(),
                        choice,
                        add_usd,
                        add_tokens,
                    }))
                    .await
            }
        }
        .map_err(words)
    }

    async fn resolve_unknown(&self, session_id: &str, admission_id: &str) -> Result<(), LinkError> {
        self.client
            .resolve_unknown(session_id, admission_id)
            .await
            .map(drop)
            .map_err(words)
    }

    async fn turn_tokens(&self, session_id: &str, admission_id: &str) -> Result<u64, LinkError> {
        let receipt = self
            .client
            .receipt(session_id, admission_id, true)
            .await
            .map_err(words)?;
        Ok(receipt.usage.map_or(0, |u| u.total_tokens))
    }

    async fn spend(&self, session_id: &str) -> Result<SessionSpend, LinkError> {
        let report: UsageReport = self
            .client
            .request(ClientRequest::UsageReport(UsageReportParams {
                by: Some(UsageGrouping::Session),
                since: None,
                session_id: Some(session_id.to_string()),
            }))
            .await
            .map_err(words)?;
        let mut spend = SessionSpend {
            tokens: report.total.total_tokens,
            cost_usd: report.total.cost_usd,
            limit_usd: None,
            limit_tokens: None,
        };
        // Its limits (a child's are its root parent's), measured as the budget measures them:
        // a token limit counts input + output tokens. A daemon without budgets has none.
        let status: Result<BudgetStatus, _> = self
            .client
            .request(ClientRequest::BudgetStatus(BudgetStatusParams {
                session_id: Some(session_id.to_string()),
            }))
            .await;
        if let Ok(status) = status {
            if status.limit_tokens.is_some() {
                spend.tokens = status.spent_tokens;
                spend.limit_tokens = status.limit_tokens;
            }
            if status.limit_usd.is_some() {
                spend.cost_usd = Some(status.spent_usd);
                spend.limit_usd = status.limit_usd;
            }
        }
        Ok(spend)
    }

    async fn budget(&self, session_id: Option<&str>) -> Result<BudgetStatus, LinkError> {
        self.client
            .request(ClientRequest::BudgetStatus(BudgetStatusParams {
                session_id: session_id.map(str::to_string),
            }))
            .await
            .map_err(words)
    }

    async fn raise_budget(
        &self,
        session_id: &str,
        add_usd: Option<f64>,
        add_tokens: Option<u64>,
    ) -> Result<BudgetStatus, LinkError> {
        self.client
            .request(ClientRequest::BudgetRaise(BudgetRaiseParams {
                session_id: Some(session_id.to_string()),
                add_usd,
                add_tokens,
            }))
            .await
            .map_err(words)
    }

    async fn sessions(&self) -> Result<Vec<SessionSummary>, LinkError> {
        let mut all = self.client.all_sessions().await.map_err(words)?;
        all.retain(|s| s.parent_session_id.is_none());
        all.sort_by(|a, b| b.started_at.total_cmp(&a.started_at));
        Ok(all)
    }

    async fn approvals(&self) -> Result<Vec<ApprovalRule>, LinkError> {
        let rules: ApprovalRules = self
            .client
            .request(ClientRequest::ApprovalsList(NoParams {}))
            .await
            .map_err(words)?;
        Ok(rules.rules)
    }

    async fn rename(&self, session_id: &str, title: &str) -> Result<(), LinkError> {
        self.client
            .rename(session_id, title)
            .await
            .map(drop)
            .map_err(words)
    }

    async fn title(&self, session_id: &str) -> Result<Option<String>, LinkError> {
        let all = self.client.all_sessions().await.map_err(words)?;
        all.into_iter()
            .find(|s| s.session_id == session_id)
            .map(|s| s.title)
            .ok_or_else(|| LinkError(format!("no session {session_id}")))
    }
}

impl ClientLink {
    /// A new session in the chat's directory, attached (one round trip).
    async fn create(&self) -> Result<SessionStream, LinkError> {
        self.client
            .create_and_attach(SessionCreateParams {
                agent: self.new_sessions.agent.clone(),
                model: self.new_sessions.model.clone(),
                base_url: self.new_sessions.base_url.clone(),
                ..SessionCreateParams::in_cwd(uuid::Uuid::new_v4().to_string(), self.cwd.clone())
            })
            .await
            .map_err(words)
    }

    async fn attach(&self, session_id: &str) -> Result<SessionStream, LinkError> {
        self.client.attach(session_id).await.map_err(words)
    }

    /// The session's stored events up to the snapshot (the stream hands out what comes
    /// after), and of them the running turn's, from its `turn.started` on. None when the
    /// daemon no longer keeps them (`snapshot_required`).
    async fn stored_events(
        &self,
        snapshot: &SessionSnapshot,
    ) -> Result<(Vec<SessionEvent>, Vec<SessionEvent>), LinkError> {
        let mut history = Vec::new();
        let mut after = 0;
        loop {
            let page = self
                .client
                .events_since(
                    &snapshot.session_id,
                    Some(&snapshot.replay_epoch),
                    after,
                    None,
                )
                .await
                .map_err(words)?;
            if page.snapshot_required {
                return Ok((Vec::new(), Vec::new()));
            }
            let mut done = false;
            for event in page.events {
                if event.seq.is_some_and(|s| s > snapshot.last_sequence) {
                    done = true;
                    break;
                }
                history.push(event);
            }
            if done || !page.has_more || page.last_sequence <= after {
                break;
            }
            after = page.last_sequence;
        }
        let running = snapshot
            .pending
            .iter()
            .find(|p| p.status == AdmissionStatus::Started)
            .and_then(|started| {
                history.iter().rposition(|e| {
                    matches!(&e.event, EventPayload::TurnStarted(t) if t.admission_id == started.admission_id)
                })
            })
            .map_or_else(Vec::new, |from| history[from..].to_vec());
        Ok((history, running))
    }
}

/// The opened session's stream, with the events of its running turn's child agents merged in.
/// A task pumps the [`drover_client::SessionStream`] into a channel, so `next` is cancel-safe.
struct ClientEvents {
    rx: mpsc::UnboundedReceiver<LinkUpdate>,
    pump: tokio::task::JoinHandle<()>,
}

impl Drop for ClientEvents {
    fn drop(&mut self) {
        self.pump.abort();
    }
}

#[async_trait]
impl Events for ClientEvents {
    async fn next(&mut self) -> Option<LinkUpdate> {
        self.rx.recv().await
    }
}

/// How long the chat client keeps trying to reach (or restart) a lost daemon before it says it
/// gave up: long enough to fix `config.toml` or free a port while it waits.
const CHAT_RECONNECT_FOR: std::time::Duration = std::time::Duration::from_secs(600);

/// The tool whose calls run child agents (SPEC section 6).
pub(crate) const DELEGATE_TASK: &str = "delegate_task";

/// Forwards the session's updates, and follows child sessions once a `delegate_task` of the
/// running turn has started (`delegating`: one had when the session was opened), until the
/// turn settles.
async fn pump(
    client: Client,
    session_id: String,
    mut stream: drover_client::SessionStream,
    delegating: bool,
    tx: mpsc::UnboundedSender<LinkUpdate>,
) {
    let watch = |on: &Arc<AtomicBool>| {
        tokio::spawn(watch_children(
            client.clone(),
            session_id.clone(),
            on.clone(),
            tx.clone(),
        ));
    };
    let mut watching: Option<Arc<AtomicBool>> = None;
    if delegating {
        let on = Arc::new(AtomicBool::new(true));
        watch(&on);
        watching = Some(on);
    }
    while let Some(item) = stream.next().await {
        let update = match item {
            Ok(update) => update,
            Err(
                e @ (ClientError::GaveUp { .. }
                | ClientError::DaemonStart { .. }
                | ClientError::Config(_)),
            ) => {
                let _ = tx.send(LinkUpdate::Closed(e.to_string()));
                break;
            }
            // An event this client cannot read is skipped (a newer daemon's type).
            Err(_) => continue,
        };
        let mut start_watching = false;
        let update = match update {
            Update::Event(event) => {
                match &event.event {
                    EventPayload::ToolStart(t) if t.name == DELEGATE_TASK => {
                        start_watching = watching.is_none();
                    }
                    EventPayload::TurnSettled(_) => {
                        if let Some(on) = watching.take() {
                            on.store(false, Ordering::Relaxed);
                        }
                    }
                    _ => {}
                }
                LinkUpdate::Event(event)
            }
            Update::Connection(ConnectionChange::Lost { why }) => LinkUpdate::Lost(why),
            Update::Connection(ConnectionChange::Reconnected { restarted, .. }) => {
                LinkUpdate::Reconnected { restarted }
            }
            Update::Connection(ConnectionChange::Restarted {
                from_version,
                to_version,
                ..
            }) => LinkUpdate::Restarted {
                from_version,
                to_version,
            },
            Update::Snapshot(snapshot) => LinkUpdate::Snapshot(snapshot),
        };
        if tx.send(update).is_err() {
            break;
        }
        // After the `tool.start` went out: a child's events never come before its parent call.
        if start_watching {
            let on = Arc::new(AtomicBool::new(true));
            watch(&on);
            watching = Some(on);
        }
    }
    if let Some(on) = watching {
        on.store(false, Ordering::Relaxed);
    }
}

/// The child sessions of `parent`'s running turn, among `all`: those not ended. The owner ends
/// every child session of an execution in the transaction that ends the execution (settled,
/// lost or retired: `agent_close`, SPEC section 6), so a child session still open belongs to
/// the parent's live execution, which is its running turn's. (Which children existed when the
/// client saw the `delegate_task` start says nothing: the owner makes the child's session in
/// the same moment, often before the client has listed anything.)
pub(crate) fn running_children(all: Vec<SessionSummary>, parent: &str) -> Vec<String> {
    all.into_iter()
        .filter(|s| s.parent_session_id.as_deref() == Some(parent) && s.ended_at.is_none())
        .map(|s| s.session_id)
        .collect()
}

/// Polls for the child sessions of `parent`'s running turn while `on`, and forwards each
/// one's events (those it stored before, then its stream).
async fn watch_children(
    client: Client,
    parent: String,
    on: Arc<AtomicBool>,
    tx: mpsc::UnboundedSender<LinkUpdate>,
) {
    let mut seen: HashSet<String> = HashSet::new();
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    while on.load(Ordering::Relaxed) && !tx.is_closed() {
        tick.tick().await;
        let Ok(all) = client.all_sessions().await else {
            continue;
        };
        for child in running_children(all, &parent) {
            if seen.contains(&child) {
                continue;
            }
            // Not reached this time: tried again on the next tick.
            let Ok(mut stream) = client.attach(&child).await else {
                continue;
            };
            seen.insert(child.clone());
            // What the child did before the attach, then the stream from there on.
            let snapshot = stream.snapshot().clone();
            let mut settled = false;
            let mut after = 0;
            while after < snapshot.last_sequence {
                let Ok(page) = client
                    .events_since(&child, Some(&snapshot.replay_epoch), after, None)
                    .await
                else {
                    break;
                };
                for event in page.events {
                    if event.seq.is_some_and(|s| s <= snapshot.last_sequence) {
                        settled |= matches!(event.event, EventPayload::TurnSettled(_));
                        let _ = tx.send(LinkUpdate::ChildEvent(child.clone(), event));
                    }
                }
                if !page.has_more || page.last_sequence <= after {
                    break;
                }
                after = page.last_sequence;
            }
            if settled {
                // A child session runs one turn: nothing more will come.
                continue;
            }
            let tx = tx.clone();
            let on = on.clone();
            tokio::spawn(async move {
                while let Some(Ok(update)) = stream.next().await {
                    if let Update::Event(event) = update {
                        let done = matches!(event.event, EventPayload::TurnSettled(_));
                        if tx
                            .send(LinkUpdate::ChildEvent(child.clone(), event))
                            .is_err()
                            || done
                        {
                            break;
                        }
                    }
                    if !on.load(Ordering::Relaxed) {
                        break;
                    }
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A session as `session.list` answers it on the wire; the fields a summary may leave out
    /// are left out.
    fn session(id: &str, parent: Option<&str>, ended: bool) -> SessionSummary {
        let summary = serde_json::json!({
            "session_id": id,
            "source": if parent.is_some() { "subagent" } else { "cli" },
            "parent_session_id": parent,
            "model": "mock",
            "started_at": 1.0,
            "ended_at": ended.then_some(2.0),
            "running": false,
            "pending_count": 0,
            "state": "idle",
            "last_activity_at": 1.0,
        });
        serde_json::from_value(summary).expect("a session summary of the wire's shape")
    }

    #[test]
    fn the_running_turns_children_are_the_open_child_sessions_of_the_parent() {
        let all = vec![
            session("p", None, false),
            // An earlier turn's child: its session ended with the turn's execution.
            session("old", Some("p"), true),
            // Made by the owner before the client listed anything: still the running turn's.
            session("now", Some("p"), false),
            session("other", Some("q"), false),
        ];
        assert_eq!(running_children(all, "p"), vec!["now".to_string()]);
    }

    #[derive(clap::Parser, Debug)]
    struct Parsed {
        #[command(flatten)]
        args: ChatArgs,
    }

    #[test]
    fn agent_is_for_a_new_session_only() {
        use clap::Parser;
        let parsed = Parsed::try_parse_from(["chat", "--agent", "codex"]).unwrap();
        assert_eq!(parsed.args.agent.as_deref(), Some("codex"));
        assert!(matches!(parsed.args.target(), Target::New));
        // An existing session runs the agent it was made with.
        for other in [&["-c"][..], &["--session", "ab12"]] {
            let line = ["chat", "--agent", "codex"].iter().chain(other);
            let e = Parsed::try_parse_from(line).unwrap_err();
            assert_eq!(e.kind(), clap::error::ErrorKind::ArgumentConflict, "{e}");
        }
    }
}
