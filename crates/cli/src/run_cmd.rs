//! `drover run` (SPEC section 8): pick or create the session, refuse a session that cannot
//! move (paused on an `unknown` turn: exit 4; an open prompt nobody here can answer: exit 5),
//! submit, and follow the turn through [`drover_client::SessionStream`] until it settles,
//! across a daemon that dies and is started again.

use crate::display::printable;
use std::collections::HashSet;
use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use drover_client::{Client, ClientError, ConnectionChange, SessionStream, Update};
use drover_protocol::client::{
    AdmissionReceipt, AdmissionStatus, ApprovalChoice, ClarifyAnswer, OpenPrompt,
    SessionCreateParams, SessionSnapshot,
};
use drover_protocol::event::{EventPayload, PromptSettlement, SessionEvent, TurnEnd, TurnPhase};
use drover_protocol::words::AdmissionOutcome;
use tokio::sync::mpsc;

use crate::commands::connect;
use crate::spinner::Spinner;
use crate::Exit;

/// `drover run` arguments (SPEC section 8).
#[derive(Args, Debug)]
pub struct RunArgs {
    /// Continue this session (its id, or any unique prefix of it).
    #[arg(long, value_name = "ID", conflicts_with = "continue_")]
    session: Option<String>,
    /// Continue the home's most recent session.
    #[arg(short = 'c', long = "continue")]
    continue_: bool,
    /// Model name for a new session (default: [model] name).
    #[arg(long)]
    model: Option<String>,
    /// Model endpoint for a new session (default: [model] base_url or $OPENAI_BASE_URL).
    #[arg(long = "base-url", value_name = "URL")]
    base_url: Option<String>,
    /// A title for the new session (`drover sessions` shows it).
    #[arg(long, value_name = "T", conflicts_with_all = ["session", "continue_"])]
    title: Option<String>,
    /// Print one JSON line per event (as the wire has it), then the receipt, on stdout.
    #[arg(long)]
    json: bool,
    /// Answer approval prompts with this choice when there is no terminal.
    #[arg(long, value_parser = ["once", "session", "deny"])]
    approve: Option<String>,
    /// Answer clarify questions with this text when there is no terminal.
    #[arg(long, value_name = "TEXT")]
    answer: Option<String>,
    /// The prompt; `-` reads it from stdin.
    prompt: String,
}

/// How often a quiet turn's receipt is read, in case its settlement was missed.
const QUIET: Duration = Duration::from_secs(30);

/// How long a `tool.start` line is held back in case an approval prompt follows it.
const HOLD_TOOL_LINE: Duration = Duration::from_millis(500);

/// How many answers that are not a choice `run` takes before it leaves the prompt open.
const ASKS: u32 = 3;

/// `drover run`.
pub async fn run(home: PathBuf, args: RunArgs) -> Result<Exit> {
    let text = prompt_text(&args.prompt)?;
    // Ctrl-C is ours from here on: one pressed before the turn is followed still interrupts
    // it (the stream keeps it), and none kills the client with the turn left running.
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .context("cannot take Ctrl-C")?;
    refuse_a_new_session_without_a_model(&home, &args, &text)?;
    let client = connect(&home).await?;
    if let Some(mismatch) = client.api_key_mismatch() {
        eprintln!("drover: {mismatch}");
    }
    let mut stream = open_session(&client, &home, &args).await?;
    let session_id = stream.session_id().to_string();
    eprintln!("drover: session {session_id}");
    let mut out = Output::new(args.json);
    if let Some(code) = refuse_stuck(&client, &mut stream, &args, &mut out).await? {
        return Ok(code);
    }
    let receipt = client.submit(&session_id, &text).await?;
    let mut turn = Turn {
        client: &client,
        session_id,
        admission_id: receipt.admission_id.clone(),
        generation: None,
        mine: false,
        interrupts: 0,
        awaiting_approval: false,
        children: None,
        flags: Flags::from(&args),
        out,
    };
    let end = turn.follow(&mut stream, &mut sigint).await;
    if let Some(children) = turn.children.take() {
        children.on.store(false, Ordering::Relaxed);
    }
    end
}

/// A new session needs a model name: without `--model` or `[model] name`, say so before a
/// daemon is started for nothing (the daemon would refuse `session.create` the same way).
/// A config that does not load is left to the daemon, which names what is wrong.
/// An empty `--model`, a `--base-url` that is not http(s), and a prompt over `[daemon]
/// max_input_bytes` are refused here too, before a session is made for nothing.
fn refuse_a_new_session_without_a_model(
    home: &std::path::Path,
    args: &RunArgs,
    text: &str,
) -> Result<()> {
    if args.model.as_deref().is_some_and(|m| m.trim().is_empty()) {
        bail!("--model must name a model, not be empty");
    }
    if let Some(url) = &args.base_url {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            bail!("--base-url {url:?} must start with http:// or https://");
        }
    }
    // A config that does not load is left to the daemon, which names what is wrong.
    let Ok(config) = drover_owner::config::Config::load(home) else {
        return Ok(());
    };
    let limit = config.daemon.max_input_bytes;
    if text.len() as u64 > limit {
        bail!(
            "the prompt is {} bytes, over [daemon] max_input_bytes = {limit}",
            text.len()
        );
    }
    let new_session = args.session.is_none() && !args.continue_ && args.model.is_none();
    if new_session && config.model.name.as_deref().is_none_or(str::is_empty) {
        bail!(
            "no model: pass --model NAME or set [model] name in {}",
            home.join("config.toml").display()
        );
    }
    Ok(())
}

/// The prompt argument, or stdin for `-`.
fn prompt_text(arg: &str) -> Result<String> {
    if arg != "-" {
        if arg.trim().is_empty() {
            bail!("the prompt is empty");
        }
        return Ok(arg.to_string());
    }
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .context("cannot read the prompt from stdin")?;
    let text = text.trim_end_matches(['\n', '\r']).to_string();
    if text.trim().is_empty() {
        bail!("the prompt from stdin is empty");
    }
    Ok(text)
}

/// `--session` (exact id, else a unique prefix), `-c`, or a new session; attached.
async fn open_session(
    client: &Client,
    home: &std::path::Path,
    args: &RunArgs,
) -> Result<SessionStream> {
    if let Some(given) = &args.session {
        // A whole id needs no listing (and a prefix is never a whole id of another).
        match client.attach(given).await {
            Ok(stream) => return Ok(stream),
            Err(e) if e.reason() == Some("not_found") => {}
            Err(e) => return Err(e.into()),
        }
        let session = client.resolve_session(given).await?;
        return Ok(client.attach(&session.session_id).await?);
    }
    if args.continue_ {
        let session = client.most_recent_session().await?;
        return Ok(client.attach(&session.session_id).await?);
    }
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    let cwd = cwd
        .to_str()
        .ok_or_else(|| anyhow!("the current directory {} is not UTF-8", cwd.display()))?;
    // `$OPENAI_BASE_URL` of this command fills what config.toml leaves out (SPEC section 1);
    // the daemon may have been started from another environment.
    let base_url = args.base_url.clone().or_else(|| {
        drover_owner::config::Config::load(home)
            .ok()
            .and_then(|c| c.base_url())
    });
    client
        .create_and_attach(SessionCreateParams {
            model: args.model.clone(),
            base_url,
            title: args.title.clone(),
            source: Some("cli".into()),
            ..SessionCreateParams::in_cwd(uuid::Uuid::new_v4().to_string(), cwd.to_string())
        })
        .await
        .map_err(|e| explain_create_error(e, home))
}

/// `session.create` errors in the words of `drover run`'s flags.
fn explain_create_error(e: ClientError, home: &std::path::Path) -> anyhow::Error {
    let config = home.join("config.toml");
    let missing = e.to_string().contains("no model endpoint");
    match e.field() {
        Some("base_url") if missing => anyhow!(
            "no model endpoint: pass --base-url URL, set [model] base_url in {}, or set $OPENAI_BASE_URL",
            config.display()
        ),
        Some("model") => anyhow!(
            "no model: pass --model NAME or set [model] name in {}",
            config.display()
        ),
        _ => e.into(),
    }
}

/// Before submitting: a session paused on an `unknown` turn runs nothing new (exit 4 naming
/// `drover resolve`); an open prompt is answered here when it can be, else exit 5 naming
/// `drover answer`.
async fn refuse_stuck(
    client: &Client,
    stream: &mut SessionStream,
    args: &RunArgs,
    out: &mut Output,
) -> Result<Option<Exit>> {
    let snapshot: SessionSnapshot = stream.snapshot().clone();
    let id = &snapshot.session_id;
    if let Some(lost) = snapshot
        .pending
        .iter()
        .find(|p| p.status == AdmissionStatus::Unknown)
    {
        eprintln!(
            "drover: session {id} is paused on an unknown turn: admission {} ({}) was running \
             when its worker or the daemon died, and its outcome is unknown; nothing runs \
             until `drover resolve {id}` closes it",
            lost.admission_id,
            quote(&lost.text)
        );
        return Ok(Some(Exit::Unknown));
    }
    for prompt in &snapshot.prompts {
        match answer_prompt(client, id, prompt, &Flags::from(args), out).await? {
            Answered::Sent => {}
            Answered::Left(code) => return Ok(Some(code)),
        }
    }
    Ok(None)
}

/// A prompt's input, quoted and cut for one line.
fn quote(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default();
    let cut: String = line.chars().take(60).collect();
    if cut.len() < text.len() {
        format!("{cut:?}...")
    } else {
        format!("{cut:?}")
    }
}

/// What stdout and stderr show: text and tool lines, or JSON lines; and the spinner.
struct Output {
    json: bool,
    spinner: Spinner,
    printed: bool,
    ends_with_newline: bool,
    /// A `tool.start` line not printed yet, and since when: if an approval prompt follows,
    /// the command is shown as the question, not as if it ran.
    held_tool: Option<(String, tokio::time::Instant)>,
    /// stdout is a terminal: the model's text is printed [`printable`]; piped, it is kept
    /// byte for byte.
    terminal: bool,
}

impl Output {
    fn new(json: bool) -> Output {
        Output {
            json,
            spinner: Spinner::new(),
            printed: false,
            ends_with_newline: true,
            held_tool: None,
            terminal: std::io::stdout().is_terminal(),
        }
    }

    /// A line on stderr (the spinner cleared first).
    fn note(&mut self, line: &str) {
        self.spinner.clear();
        if self.printed && !self.ends_with_newline && !self.json {
            println!();
            self.ends_with_newline = true;
        }
        eprintln!("{line}");
    }

    fn flush_tool(&mut self) {
        if let Some((line, _)) = self.held_tool.take() {
            if !self.json {
                self.note(&line);
            }
        }
    }

    /// Prints a held `tool.start` line once no approval prompt followed it for a while.
    fn flush_tool_after(&mut self, quiet: Duration) {
        if self
            .held_tool
            .as_ref()
            .is_some_and(|(_, since)| since.elapsed() >= quiet)
        {
            self.flush_tool();
        }
    }

    fn hold_tool(&mut self, line: String) {
        self.held_tool = Some((line, tokio::time::Instant::now()));
    }

    /// The held line's text, taken.
    fn take_tool(&mut self) -> Option<String> {
        self.held_tool.take().map(|(line, _)| line)
    }

    fn text(&mut self, text: &str) {
        if self.json || text.is_empty() {
            return;
        }
        self.spinner.clear();
        let mut stdout = std::io::stdout();
        let _ = match self.terminal {
            true => write!(stdout, "{}", printable(text)),
            false => write!(stdout, "{text}"),
        };
        let _ = stdout.flush();
        self.printed = true;
        self.ends_with_newline = text.ends_with('\n');
    }

    fn end_text(&mut self) {
        if !self.json && self.printed && !self.ends_with_newline {
            println!();
            self.ends_with_newline = true;
        }
    }

    fn json_line(&mut self, value: &impl serde::Serialize) {
        if !self.json {
            return;
        }
        self.spinner.clear();
        if let Ok(line) = serde_json::to_string(value) {
            println!("{line}");
        }
    }
}

/// One submitted turn being followed.
struct Turn<'a> {
    client: &'a Client,
    session_id: String,
    admission_id: String,
    generation: Option<u64>,
    /// Our turn has started: the deltas and tools that follow are ours.
    mine: bool,
    interrupts: u32,
    /// An approval prompt of ours is open: its held `tool.start` line waits for the answer.
    awaiting_approval: bool,
    /// The prompts of child agents, once a `delegate_task` of ours started.
    children: Option<ChildPrompts>,
    flags: Flags,
    out: Output,
}

/// The open prompts of a turn's child agents, followed since its first `delegate_task`: each
/// is answered here like the turn's own (or left, exit 5, naming the child's session).
struct ChildPrompts {
    /// Cleared when the turn ends: the watcher stops.
    on: Arc<AtomicBool>,
    prompts: mpsc::UnboundedReceiver<(String, OpenPrompt)>,
}

impl ChildPrompts {
    fn start(client: &Client, parent: &str) -> ChildPrompts {
        let on = Arc::new(AtomicBool::new(true));
        let (tx, prompts) = mpsc::unbounded_channel();
        tokio::spawn(watch_child_prompts(
            client.clone(),
            parent.to_string(),
            on.clone(),
            tx,
        ));
        ChildPrompts { on, prompts }
    }
}

/// The next child prompt; never, before a `delegate_task` started.
async fn next_child_prompt(children: &mut Option<ChildPrompts>) -> Option<(String, OpenPrompt)> {
    match children {
        Some(children) => children.prompts.recv().await,
        None => std::future::pending().await,
    }
}

/// Polls for the child sessions of `parent`'s running turn while `on`; attaches to each once
/// and sends its open prompts (those open at the attach, then new ones) with its session id.
async fn watch_child_prompts(
    client: Client,
    parent: String,
    on: Arc<AtomicBool>,
    tx: mpsc::UnboundedSender<(String, OpenPrompt)>,
) {
    let mut seen: HashSet<String> = HashSet::new();
    let mut tick = tokio::time::interval(Duration::from_millis(300));
    while on.load(Ordering::Relaxed) && !tx.is_closed() {
        tick.tick().await;
        let Ok(all) = client.all_sessions().await else {
            continue;
        };
        for child in crate::chat::running_children(all, &parent) {
            if seen.contains(&child) {
                continue;
            }
            // Not reached this time: tried again on the next tick.
            let Ok(mut stream) = client.attach(&child).await else {
                continue;
            };
            seen.insert(child.clone());
            for prompt in stream.snapshot().prompts.clone() {
                let _ = tx.send((child.clone(), prompt));
            }
            let (tx, on) = (tx.clone(), on.clone());
            tokio::spawn(async move {
                while let Some(Ok(update)) = stream.next().await {
                    if let Update::Event(event) = update {
                        let gone = match event.event {
                            EventPayload::ApprovalRequest(prompt)
                            | EventPayload::ClarifyRequest(prompt) => {
                                tx.send((child.clone(), prompt)).is_err()
                            }
                            // A child session runs one turn.
                            EventPayload::TurnSettled(_) => true,
                            _ => false,
                        };
                        if gone {
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

impl Turn<'_> {
    /// Streams the admission's events until it settles.
    async fn follow(
        &mut self,
        stream: &mut SessionStream,
        sigint: &mut tokio::signal::unix::Signal,
    ) -> Result<Exit> {
        self.out.spinner.wait("the turn to start");
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        let mut quiet_since = tokio::time::Instant::now();
        loop {
            let update = tokio::select! {
                u = stream.next() => u,
                _ = tick.tick() => {
                    self.out.spinner.tick();
                    if !self.awaiting_approval {
                        self.out.flush_tool_after(HOLD_TOOL_LINE);
                    }
                    if quiet_since.elapsed() >= QUIET {
                        quiet_since = tokio::time::Instant::now();
                        if let Some(code) = self.check_receipt(false).await? {
                            return Ok(code);
                        }
                    }
                    continue;
                }
                _ = sigint.recv() => {
                    if let Some(code) = self.ctrl_c().await? {
                        return Ok(code);
                    }
                    continue;
                }
                Some((child, prompt)) = next_child_prompt(&mut self.children) => {
                    self.out.flush_tool();
                    self.out.note(&format!("drover: child agent {child} asks:"));
                    let answered =
                        answer_prompt(self.client, &child, &prompt, &self.flags, &mut self.out)
                            .await?;
                    match answered {
                        Answered::Sent => self.out.spinner.wait("the child agent"),
                        Answered::Left(code) => return Ok(code),
                    }
                    continue;
                }
            };
            quiet_since = tokio::time::Instant::now();
            let update = match update {
                None => return Ok(self.lost_for_good("the client stopped")),
                Some(Err(e @ ClientError::GaveUp { .. })) => {
                    return Ok(self.lost_for_good(&e.to_string()))
                }
                Some(Err(e)) => return Err(e.into()),
                Some(Ok(u)) => u,
            };
            let code = match update {
                Update::Event(e) => self.event(e).await?,
                Update::Connection(ConnectionChange::Lost { why }) => {
                    self.out.note(&format!(
                        "drover: lost the connection to the daemon ({why}); reconnecting"
                    ));
                    self.out.spinner.wait("the daemon to come back");
                    None
                }
                Update::Connection(ConnectionChange::Reconnected { restarted, .. }) => {
                    self.out.spinner.wait("the turn");
                    self.check_receipt(restarted).await?
                }
                Update::Snapshot(_) => self.check_receipt(false).await?,
            };
            if let Some(code) = code {
                return Ok(code);
            }
        }
    }

    /// The daemon cannot be reached again: what became of the turn cannot be known here.
    fn lost_for_good(&mut self, why: &str) -> Exit {
        let id = &self.session_id;
        self.out.note(&format!(
            "drover: {why}; the turn's outcome is unknown: once the daemon is back, `drover \
             show {id}` says what it did and `drover resolve {id}` lets the session go on"
        ));
        Exit::Unknown
    }

    /// Reads the receipt: a settled turn ends the run. After the daemon restarted, a turn it
    /// was running is `unknown` (SPEC G2: never replayed).
    async fn check_receipt(&mut self, restarted: bool) -> Result<Option<Exit>> {
        let r = self
            .client
            .receipt(&self.session_id, &self.admission_id, true)
            .await?;
        let Some(end) = receipt_end(&r)? else {
            return Ok(None);
        };
        if end == TurnEnd::Unknown && restarted {
            let id = &self.session_id;
            self.out.end_text();
            self.out.json_line(&r);
            self.out.note(&format!(
                "drover: the daemon stopped while the turn ran; its outcome is unknown; \
                 `drover resolve {id}` closes it as interrupted and lets the session go on"
            ));
            return Ok(Some(Exit::Unknown));
        }
        let error = r.result.as_ref().and_then(|res| res.error.clone());
        self.out.end_text();
        self.out.json_line(&r);
        Ok(Some(self.finish(end, error.as_deref())))
    }

    /// With `--json`, the turn's last line: its receipt with the result.
    async fn json_receipt(&mut self) -> Result<()> {
        if self.out.json {
            let r = self
                .client
                .receipt(&self.session_id, &self.admission_id, true)
                .await?;
            self.out.json_line(&r);
        }
        Ok(())
    }

    async fn ctrl_c(&mut self) -> Result<Option<Exit>> {
        self.interrupts += 1;
        if self.interrupts > 1 {
            return Ok(Some(Exit::Interrupted));
        }
        self.out
            .note("\ndrover: interrupting (Ctrl-C again to leave at once)");
        // The turn's events say what happened; a refusal here only means it already ended.
        let _ = self.stop_turn().await;
        Ok(None)
    }

    /// Interrupts the turn if it started, else cancels it. Its `turn.started` may not have
    /// reached this client yet, so the receipt says which (and a queued turn that starts
    /// before the cancel lands is interrupted instead).
    async fn stop_turn(&mut self) -> Result<(), ClientError> {
        if self.generation.is_none() {
            let mut r = self
                .client
                .receipt(&self.session_id, &self.admission_id, false)
                .await?;
            if r.status == AdmissionStatus::Queued {
                match self
                    .client
                    .cancel(&self.session_id, &self.admission_id)
                    .await
                {
                    Err(e) if e.reason() == Some("stale_generation") => {}
                    other => return other.map(drop),
                }
                r = self
                    .client
                    .receipt(&self.session_id, &self.admission_id, false)
                    .await?;
            }
            self.generation = r.execution_generation;
        }
        match self.generation {
            Some(g) => self.client.interrupt(&self.session_id, g).await.map(drop),
            None => Ok(()),
        }
    }

    async fn event(&mut self, event: SessionEvent) -> Result<Option<Exit>> {
        let ours = admission_of(&event.event) == Some(self.admission_id.as_str());
        if ours || self.mine {
            self.out.json_line(&event);
        }
        match &event.event {
            EventPayload::TurnStarted(p) if ours => {
                self.mine = true;
                self.generation = Some(p.execution_generation);
                self.out.spinner.wait("the model");
            }
            EventPayload::TurnStarted(_) if !self.mine => {
                self.out.spinner.wait("the turn ahead of this one");
            }
            EventPayload::MessageDelta(p) if self.mine => {
                self.out.flush_tool();
                self.out.text(&p.text);
                self.out.spinner.wait("the model");
            }
            EventPayload::TurnProgress(p) if self.mine => match p.phase {
                TurnPhase::ModelRequest => self.out.spinner.wait("the model"),
                TurnPhase::Tool => self.out.spinner.wait("a tool to finish"),
                TurnPhase::PromptWait => self.out.spinner.wait("an answer"),
            },
            EventPayload::ToolStart(p) if self.mine => {
                if p.name == crate::chat::DELEGATE_TASK && self.children.is_none() {
                    self.children = Some(ChildPrompts::start(self.client, &self.session_id));
                }
                self.out.flush_tool();
                self.out.end_text();
                self.out
                    .hold_tool(format!("[{}] {}", p.name, printable(&p.context)));
                self.out.spinner.wait(&format!("{} to finish", p.name));
            }
            EventPayload::ToolComplete(p) if self.mine => {
                self.out.flush_tool();
                if p.is_error {
                    // `name` is null only for a call the owner does not know.
                    self.out
                        .note(&format!("[{}] error", p.name.as_deref().unwrap_or("tool")));
                }
                self.out.spinner.wait("the model");
            }
            EventPayload::ApprovalRequest(prompt) | EventPayload::ClarifyRequest(prompt)
                if self.mine =>
            {
                if matches!(prompt, OpenPrompt::Clarify(_)) {
                    self.out.flush_tool();
                }
                // The command shows as the question; it runs only once approved.
                let held = self.out.held_tool.take();
                let answered = answer_prompt(
                    self.client,
                    &self.session_id,
                    prompt,
                    &self.flags,
                    &mut self.out,
                )
                .await;
                self.out.held_tool = held;
                match answered? {
                    Answered::Sent => self.out.spinner.wait("the answer to be recorded"),
                    Answered::Left(code) => return Ok(Some(code)),
                }
            }
            EventPayload::ApprovalSettled(p) if self.mine => {
                let ran = p.status == PromptSettlement::Resolved
                    && p.choice.is_some_and(|c| c != ApprovalChoice::Deny);
                self.awaiting_approval = false;
                match self.out.take_tool() {
                    Some(line) if ran => self.out.note(&line),
                    Some(line) => self.out.note(&format!("{line} (not run)")),
                    None => {}
                }
            }
            EventPayload::MessageComplete(p) if ours => {
                self.out.flush_tool();
                if !self.out.printed {
                    self.out.text(&p.text);
                }
                self.out.end_text();
            }
            EventPayload::TurnSettled(p) if ours => {
                self.out.flush_tool();
                self.out.end_text();
                self.json_receipt().await?;
                if p.outcome == TurnEnd::Unknown {
                    let id = &self.session_id;
                    self.out.note(&format!(
                        "drover: the turn's outcome is unknown (its worker or the daemon died \
                         while it ran); it will not be replayed; `drover resolve {id}` closes \
                         it and lets the session go on"
                    ));
                    return Ok(Some(Exit::Unknown));
                }
                return Ok(Some(self.finish(p.outcome, p.error.as_deref())));
            }
            EventPayload::AdmissionUpdated(p)
                if ours && p.outcome == Some(AdmissionOutcome::Cancelled) =>
            {
                self.out.note("drover: cancelled before it started");
                self.json_receipt().await?;
                return Ok(Some(if self.interrupts > 0 {
                    Exit::Interrupted
                } else {
                    Exit::Failed
                }));
            }
            _ => {}
        }
        Ok(None)
    }

    fn finish(&mut self, end: TurnEnd, error: Option<&str>) -> Exit {
        match end {
            TurnEnd::Completed => Exit::Ok,
            TurnEnd::Unknown => {
                let id = &self.session_id;
                self.out.note(&format!(
                    "drover: the turn's outcome is unknown (its worker or the daemon died while \
                     it ran); it will not be replayed; `drover resolve {id}` closes it and lets \
                     the session go on"
                ));
                Exit::Unknown
            }
            TurnEnd::Interrupted if self.interrupts > 0 => Exit::Interrupted,
            other => {
                let other = end_word(other);
                match error {
                    Some(e) => self.out.note(&format!("drover: turn {other}: {e}")),
                    None => self.out.note(&format!("drover: turn {other}")),
                }
                Exit::Failed
            }
        }
    }
}

/// The flags that answer prompts without a terminal.
#[derive(Debug, Clone, Default)]
struct Flags {
    approve: Option<String>,
    answer: Option<String>,
}

impl From<&RunArgs> for Flags {
    fn from(a: &RunArgs) -> Flags {
        Flags {
            approve: a.approve.clone(),
            answer: a.answer.clone(),
        }
    }
}

/// What became of an open prompt.
enum Answered {
    /// An answer was sent (the prompt's `settled` event says which one was recorded).
    Sent,
    /// It stays open: nobody here can answer it.
    Left(Exit),
}

/// `once`, `session`, `always`, `deny`, or the first letters of all but `always` (`y`/`yes` for
/// once, `n`/`no` for deny). `always` stores a home-wide rule, so it is never one stray key.
fn parse_choice(answer: &str) -> Option<ApprovalChoice> {
    match answer.trim().to_ascii_lowercase().as_str() {
        "once" | "o" | "y" | "yes" => Some(ApprovalChoice::Once),
        "session" | "s" => Some(ApprovalChoice::Session),
        "always" => Some(ApprovalChoice::Always),
        "deny" | "d" | "n" | "no" => Some(ApprovalChoice::Deny),
        _ => None,
    }
}

fn choice_word(c: ApprovalChoice) -> &'static str {
    match c {
        ApprovalChoice::Once => "once",
        ApprovalChoice::Session => "session",
        ApprovalChoice::Always => "always",
        ApprovalChoice::Deny => "deny",
    }
}

/// One line from the terminal; `None` at end of input.
async fn read_answer(out: &mut Output, question: &str) -> Result<Option<String>> {
    out.spinner.clear();
    eprint!("{question}");
    let line = tokio::task::spawn_blocking(|| {
        let mut s = String::new();
        std::io::stdin().read_line(&mut s).map(|n| (n, s))
    })
    .await??;
    Ok(match line {
        (0, _) => None,
        (_, s) => Some(s.trim().to_string()),
    })
}

/// Answers an approval or clarify prompt from the flags or the terminal; an answer that is
/// not one of the choices asks again, [`ASKS`] times at most. Without either the prompt stays
/// open for another client: exit 5 naming `drover answer`.
async fn answer_prompt(
    client: &Client,
    session_id: &str,
    prompt: &OpenPrompt,
    flags: &Flags,
    out: &mut Output,
) -> Result<Answered> {
    let interactive = std::io::stdin().is_terminal();
    let left = |out: &mut Output, why: &str| {
        let (kind, prompt_id, how) = match prompt {
            OpenPrompt::Approval(p) => (
                "an approval",
                &p.prompt_id,
                format!(
                    "`drover answer {session_id} --choice once|session|always|deny` (for `{}`), or pass --approve",
                    printable(&p.command)
                ),
            ),
            OpenPrompt::Clarify(p) => (
                "a clarify",
                &p.prompt_id,
                format!(
                    "`drover answer {session_id} --text TEXT` (to {:?}), or pass --answer",
                    printable(&p.question)
                ),
            ),
        };
        out.note(&format!(
            "drover: {kind} prompt is waiting (prompt_id {prompt_id}) {why}; it stays open: \
             answer it with {how}"
        ));
        Answered::Left(Exit::PromptWaiting)
    };
    match prompt {
        OpenPrompt::Approval(p) => {
            let choice = match flags.approve.as_deref() {
                Some(flag) => parse_choice(flag),
                None if interactive => {
                    let offered: Vec<&str> = p.choices.iter().map(|c| choice_word(*c)).collect();
                    let question = format!(
                        "drover: `{}` needs approval ({}).\n  run it? [{}] (always: every command of this kind, in every session of this home) ",
                        printable(&p.command),
                        p.description,
                        offered.join("/")
                    );
                    let mut picked = None;
                    for _ in 0..ASKS {
                        let Some(line) = read_answer(out, &question).await? else {
                            return Ok(left(out, "and the terminal closed"));
                        };
                        match parse_choice(&line) {
                            Some(c) if p.choices.contains(&c) => {
                                picked = Some(c);
                                break;
                            }
                            _ => out.note(&format!(
                                "drover: {line:?} is not a choice; answer one of {}",
                                offered.join(", ")
                            )),
                        }
                    }
                    match picked {
                        Some(c) => Some(c),
                        None => {
                            return Ok(left(
                                out,
                                &format!("after {ASKS} answers that are not a choice"),
                            ))
                        }
                    }
                }
                None => return Ok(left(out, "and there is no terminal to ask on")),
            };
            let Some(choice) = choice else {
                return Ok(left(out, "and --approve is not a choice"));
            };
            let answered = respond(
                out,
                client
                    .respond_approval(session_id, p.execution_generation, &p.prompt_id, choice)
                    .await,
            );
            if choice == ApprovalChoice::Always && matches!(answered, Ok(Answered::Sent)) {
                out.note(&format!(
                    "drover: stored rule `{}`: {} now runs without asking, in every session of \
                     this home, until `drover approvals rm {}`",
                    p.pattern_key, p.description, p.pattern_key
                ));
            }
            answered
        }
        OpenPrompt::Clarify(p) => {
            let text = match flags.answer.clone() {
                Some(a) => a,
                None if interactive => {
                    let question = match p.choices.is_empty() {
                        true => format!("drover: {} ", printable(&p.question)),
                        false => format!(
                            "drover: {} [{}] ",
                            printable(&p.question),
                            printable(&p.choices.join("/"))
                        ),
                    };
                    let mut picked = None;
                    for _ in 0..ASKS {
                        let Some(line) = read_answer(out, &question).await? else {
                            return Ok(left(out, "and the terminal closed"));
                        };
                        if p.choices.is_empty() || p.choices.contains(&line) {
                            picked = Some(line);
                            break;
                        }
                        out.note(&format!(
                            "drover: {line:?} is not a choice; answer one of {}",
                            p.choices.join(", ")
                        ));
                    }
                    match picked {
                        Some(t) => t,
                        None => {
                            return Ok(left(
                                out,
                                &format!("after {ASKS} answers that are not a choice"),
                            ))
                        }
                    }
                }
                None => return Ok(left(out, "and there is no terminal to ask on")),
            };
            respond(
                out,
                client
                    .respond_clarify(
                        session_id,
                        p.execution_generation,
                        &p.prompt_id,
                        ClarifyAnswer::Text(text),
                    )
                    .await,
            )
        }
    }
}

/// A refused answer is said and the turn followed on: its events say what was recorded.
fn respond<T>(out: &mut Output, answer: Result<T, ClientError>) -> Result<Answered> {
    match answer {
        Ok(_) => Ok(Answered::Sent),
        Err(e) if e.rpc().is_some() => {
            out.note(&format!("drover: {e}"));
            Ok(Answered::Sent)
        }
        Err(e) => Err(e.into()),
    }
}

/// The admission an event is about, for the events that name one.
fn admission_of(event: &EventPayload) -> Option<&str> {
    match event {
        EventPayload::TurnStarted(p) => Some(&p.admission_id),
        EventPayload::MessageComplete(p) => Some(&p.admission_id),
        EventPayload::TurnSettled(p) => Some(&p.admission_id),
        EventPayload::AdmissionUpdated(p) => Some(&p.admission_id),
        EventPayload::TurnProgress(p) => Some(&p.admission_id),
        _ => None,
    }
}

/// How a settled receipt's turn ended: `unknown` while its status is, else its outcome.
fn receipt_end(r: &AdmissionReceipt) -> Result<Option<TurnEnd>> {
    let outcome = match r.status {
        AdmissionStatus::Queued | AdmissionStatus::Started => return Ok(None),
        AdmissionStatus::Unknown => return Ok(Some(TurnEnd::Unknown)),
        AdmissionStatus::Terminal => r.outcome.ok_or_else(|| {
            anyhow!(
                "prompt.receipt: admission {} is terminal without an outcome",
                r.admission_id
            )
        })?,
    };
    Ok(Some(match outcome {
        AdmissionOutcome::Completed => TurnEnd::Completed,
        AdmissionOutcome::Interrupted => TurnEnd::Interrupted,
        AdmissionOutcome::Failed => TurnEnd::Failed,
        AdmissionOutcome::Rejected => TurnEnd::Rejected,
        AdmissionOutcome::Cancelled => TurnEnd::Cancelled,
    }))
}

/// The turn's word in `drover: turn <word>` (the wire's snake_case word).
fn end_word(end: TurnEnd) -> &'static str {
    match end {
        TurnEnd::Completed => "completed",
        TurnEnd::Interrupted => "interrupted",
        TurnEnd::Failed => "failed",
        TurnEnd::Rejected => "rejected",
        TurnEnd::Cancelled => "cancelled",
        TurnEnd::Unknown => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn approval_answers_are_the_choice_words_or_their_letters() {
        assert_eq!(parse_choice(" Once\n"), Some(ApprovalChoice::Once));
        assert_eq!(parse_choice("y"), Some(ApprovalChoice::Once));
        assert_eq!(parse_choice("s"), Some(ApprovalChoice::Session));
        assert_eq!(parse_choice("always"), Some(ApprovalChoice::Always));
        assert_eq!(parse_choice("a"), None, "a home-wide rule is never one key");
        assert_eq!(parse_choice("n"), Some(ApprovalChoice::Deny));
        assert_eq!(parse_choice("yse"), None);
        assert_eq!(parse_choice(""), None);
    }
}
