//! One turn of an external agent: its process started, the ACP handshake, its session loaded
//! or made, the prompt sent, every update recorded and every permission asked, and the end:
//! settled from the stop reason, or lost (the agent gone or silent while the prompt ran).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    CancelNotification, ClientCapabilities, ContentBlock, Implementation, InitializeRequest,
    InitializeResponse, ListSessionsRequest, LoadSessionRequest, NewSessionRequest, PromptRequest,
    PromptResponse, RequestPermissionRequest, RequestPermissionResponse, SessionId,
    SessionNotification, StopReason, TextContent,
};
use agent_client_protocol::v1::{ConnectionTo, Responder};
use agent_client_protocol::{
    is_connection_terminated, is_incoming_transport_closed, on_receive_notification,
    on_receive_request, Agent, Client, Lines,
};
use async_trait::async_trait;
use drover_agent::{StoreError, TurnReport, TurnStore, INTERRUPTED_RESULT};
use drover_protocol::worker::{ExternalAgent, TurnOutcome, UsageAdd};
use drover_protocol::Usage;
use drover_tools::sandbox::Sandbox;
use drover_tools::{ApprovalGrants, LiveApprovalMode, PromptAnswer, PromptBroker};
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use tokio::io::AsyncWriteExt;
use tokio::process::{ChildStdin, ChildStdout};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::codec::{FramedRead, LinesCodec};
use tokio_util::sync::CancellationToken;

use crate::agent_process::AgentProcess;
use crate::error::ExternalError;
use crate::permission::{cancelled, Ask};
use crate::record::{Recorder, NO_RESULT};

/// The longest ACP message line read from an agent.
const MAX_LINE_BYTES: usize = 32 * 1024 * 1024;
/// How long an agent whose turn is over has to exit on its own (its stdin closed) before its
/// group is stopped. Short: the agents tried do not exit on end of file, and the turn's end
/// waits for this.
const EXIT_WAIT: Duration = Duration::from_millis(100);
/// SIGTERM to SIGKILL when a settled agent is stopped (its leader's exit ends the wait).
const KILL_GRACE: Duration = Duration::from_secs(2);
/// How long, after the agent process exited, its last answer may still be in the pipe.
const LAST_WORDS: Duration = Duration::from_secs(1);
/// Sessions `session/list` pages read at most while looking for the agent's session.
const LIST_PAGES: usize = 20;

/// Where the agent's session id goes once the agent made one (`agent.session`).
#[async_trait]
pub trait AgentSessions: Send + Sync {
    /// Records `agent_session_id` as the session's agent session, which later turns load.
    async fn found(&self, agent_session_id: &str) -> Result<(), StoreError>;
}

/// Everything one turn of an external agent needs.
pub struct ExternalTurn<'a> {
    /// The agent, as the owner resolved it.
    pub agent: &'a ExternalAgent,
    /// The session's working directory (the agent's too).
    pub cwd: PathBuf,
    /// The user's input (stored by the owner already).
    pub input: String,
    /// The session's sandbox, applied to the agent process when `agent.sandbox`.
    pub sandbox: Sandbox,
    /// Where the transcript, usage and live text go.
    pub store: &'a dyn TurnStore,
    /// Where approvals are asked.
    pub prompts: &'a dyn PromptBroker,
    /// The session's approval mode, read at each permission request.
    pub approvals: LiveApprovalMode,
    /// The pattern keys a `session` or `always` answer granted.
    pub grants: ApprovalGrants,
    /// Fired to interrupt the turn (`session/cancel`, then the group killed).
    pub cancel: CancellationToken,
    /// Where the agent's session id goes.
    pub sessions: &'a dyn AgentSessions,
}

/// How a turn of an external agent ended.
#[derive(Debug)]
pub enum TurnEnd {
    /// The agent answered the prompt (or never got it): `execution.finish` with this report.
    Settled(TurnReport),
    /// The agent exited or fell silent while the prompt ran: what it did is unknown, so the
    /// worker exits without `execution.finish` and the owner makes the turn `unknown`.
    Lost(String),
}

/// A message from the agent, in the order the connection received it.
enum Event {
    Update(SessionNotification),
    Permission(
        RequestPermissionRequest,
        Responder<RequestPermissionResponse>,
    ),
}

/// Why the turn stopped before its prompt was sent.
enum Setup {
    Failed(ExternalError),
    Interrupted,
}

/// When the agent was last heard from, shared with the transport's reader.
#[derive(Clone)]
struct Heard {
    start: Instant,
    millis: Arc<AtomicU64>,
}

impl Heard {
    fn new() -> Heard {
        Heard {
            start: Instant::now(),
            millis: Arc::new(AtomicU64::new(0)),
        }
    }

    fn touch(&self) {
        let now = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.millis.store(now, Ordering::Release);
    }

    fn last(&self) -> Instant {
        self.start + Duration::from_millis(self.millis.load(Ordering::Acquire))
    }
}

/// Runs one turn of `turn.agent` (see the crate's doc). Never panics on the agent's output.
pub async fn run_turn(turn: ExternalTurn<'_>) -> TurnEnd {
    let agent = turn.agent;
    if turn.cancel.is_cancelled() {
        return TurnEnd::Settled(report(agent, TurnOutcome::Interrupted, String::new(), None));
    }
    let (process, stdin, stdout) = match AgentProcess::spawn(agent, &turn.cwd, &turn.sandbox) {
        Ok(spawned) => spawned,
        Err(e) => return TurnEnd::Settled(failed(agent, e.to_string())),
    };
    let heard = Heard::new();
    let prompt_sent = AtomicBool::new(false);
    let end = connect(&turn, &process, stdin, stdout, heard, &prompt_sent).await;
    // A settled agent may finish its own writes (its session) and exit; a lost or interrupted
    // one is killed at once (it had its chance to stop).
    let (wait, grace) = match &end {
        TurnEnd::Settled(report) if report.outcome != TurnOutcome::Interrupted => {
            (EXIT_WAIT, KILL_GRACE)
        }
        _ => (Duration::ZERO, Duration::ZERO),
    };
    process.stop(wait, grace).await;
    end
}

/// The ACP connection over the agent's stdio, driven until the turn ends.
async fn connect(
    turn: &ExternalTurn<'_>,
    process: &AgentProcess,
    stdin: ChildStdin,
    stdout: ChildStdout,
    heard: Heard,
    prompt_sent: &AtomicBool,
) -> TurnEnd {
    let agent = turn.agent;
    let reader = heard.clone();
    let incoming =
        FramedRead::new(stdout, LinesCodec::new_with_max_length(MAX_LINE_BYTES)).map(move |line| {
            reader.touch();
            line.map_err(std::io::Error::other)
        });
    let outgoing = futures::sink::unfold(stdin, |mut stdin, line: String| async move {
        stdin.write_all(line.as_bytes()).await?;
        stdin.write_all(b"\n").await?;
        stdin.flush().await?;
        Ok::<_, std::io::Error>(stdin)
    });
    let transport = Lines::new(Box::pin(outgoing), Box::pin(incoming));
    let (events, received) = mpsc::unbounded_channel();
    let permissions = events.clone();
    let driven = Client
        .v1()
        .name("drover")
        .on_receive_notification(
            async move |notification: SessionNotification, _cx| {
                let _ = events.send(Event::Update(notification));
                Ok(())
            },
            on_receive_notification!(),
        )
        .on_receive_request(
            async move |request: RequestPermissionRequest, responder, _cx| {
                // Answered by the turn's loop, so the connection goes on while a human decides.
                if let Err(mpsc::error::SendError(Event::Permission(_, responder))) =
                    permissions.send(Event::Permission(request, responder))
                {
                    return responder.respond(cancelled());
                }
                Ok(())
            },
            on_receive_request!(),
        )
        .connect_with(transport, async |cx: ConnectionTo<Agent>| {
            let mut driver = Driver {
                turn,
                cx,
                received,
                exited: process.exited(),
                heard,
            };
            Ok(driver.run(prompt_sent).await)
        })
        .await;
    match driven {
        Ok(end) => end,
        Err(e) if prompt_sent.load(Ordering::Acquire) => TurnEnd::Lost(format!(
            "agent_lost: the connection to the agent broke mid-turn: {e}"
        )),
        Err(e) => TurnEnd::Settled(failed(
            agent,
            format!("the connection to the agent broke: {e}"),
        )),
    }
}

struct Driver<'t, 'a> {
    turn: &'t ExternalTurn<'a>,
    cx: ConnectionTo<Agent>,
    received: mpsc::UnboundedReceiver<Event>,
    exited: tokio::sync::watch::Receiver<Option<String>>,
    heard: Heard,
}

impl Driver<'_, '_> {
    fn stall(&self) -> Duration {
        Duration::from_secs(self.turn.agent.stall_timeout_s.max(1))
    }

    async fn run(&mut self, prompt_sent: &AtomicBool) -> TurnEnd {
        let agent = self.turn.agent;
        let session = match self.start().await {
            Ok(session) => session,
            Err(Setup::Interrupted) => {
                return TurnEnd::Settled(report(
                    agent,
                    TurnOutcome::Interrupted,
                    String::new(),
                    None,
                ))
            }
            Err(Setup::Failed(e)) => {
                tracing::warn!(agent = %agent.name, error = %e, "the agent did not start");
                return TurnEnd::Settled(failed(agent, e.to_string()));
            }
        };
        // What the agent said before the prompt (a load's replay, command lists) is not this
        // turn's: drover's transcript is the source of truth.
        self.drop_pending();
        prompt_sent.store(true, Ordering::Release);
        self.prompt(session).await
    }

    /// `initialize`, then the agent's session: loaded when the agent has it, else new.
    async fn start(&mut self) -> Result<SessionId, Setup> {
        let turn = self.turn;
        let init = InitializeRequest::new(ProtocolVersion::V1)
            .client_capabilities(ClientCapabilities::new())
            .client_info(Implementation::new("drover", env!("CARGO_PKG_VERSION")));
        let init: InitializeResponse = self
            .setup("initialize", self.cx.send_request(init).block_task())
            .await?;
        let caps = &init.agent_capabilities;
        if let Some(id) = turn.agent.agent_session_id.as_deref() {
            if caps.load_session && self.listed(&init, id).await? {
                let load = LoadSessionRequest::new(id.to_string(), turn.cwd.clone());
                match self
                    .setup("session/load", self.cx.send_request(load).block_task())
                    .await
                {
                    Ok(_) => {
                        tracing::info!(agent = %turn.agent.name, agent_session_id = id, "agent session loaded");
                        return Ok(SessionId::new(id.to_string()));
                    }
                    Err(Setup::Failed(e)) => {
                        tracing::warn!(agent = %turn.agent.name, agent_session_id = id, error = %e, "the agent's session could not be loaded; starting a new one");
                    }
                    Err(interrupted) => return Err(interrupted),
                }
            } else {
                tracing::warn!(agent = %turn.agent.name, agent_session_id = id, "the agent does not have its session any more; starting a new one");
            }
        }
        let new = NewSessionRequest::new(turn.cwd.clone());
        let made = self
            .setup("session/new", self.cx.send_request(new).block_task())
            .await?;
        let id = made.session_id.0.to_string();
        tracing::info!(agent = %turn.agent.name, agent_session_id = %id, "agent session made");
        turn.sessions.found(&id).await.map_err(|e| {
            Setup::Failed(ExternalError::Protocol {
                method: "session/new",
                message: format!("its session id could not be stored: {}", e.message),
            })
        })?;
        Ok(made.session_id)
    }

    /// Whether session `id` is the agent's: `session/list` says so when the agent has it
    /// (some agents answer `session/load` of an unknown id with success); without it, the
    /// load itself decides.
    async fn listed(&self, init: &InitializeResponse, id: &str) -> Result<bool, Setup> {
        let can_list = init.agent_capabilities.session_capabilities.list.is_some();
        if !can_list {
            return Ok(true);
        }
        let mut cursor = None;
        for _ in 0..LIST_PAGES {
            let request = ListSessionsRequest::new().cursor(cursor.take());
            let page = match self
                .setup("session/list", self.cx.send_request(request).block_task())
                .await
            {
                Ok(page) => page,
                Err(Setup::Failed(e)) => {
                    tracing::warn!(error = %e, "session/list failed; trying session/load");
                    return Ok(true);
                }
                Err(interrupted) => return Err(interrupted),
            };
            if page.sessions.iter().any(|s| *s.session_id.0 == *id) {
                return Ok(true);
            }
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => return Ok(false),
            }
        }
        Ok(false)
    }

    /// One request before the prompt: its answer, unless the agent errs, exits, stays
    /// silent for the stall time, or the turn is interrupted.
    async fn setup<T>(
        &self,
        method: &'static str,
        request: impl std::future::Future<Output = Result<T, agent_client_protocol::Error>>,
    ) -> Result<T, Setup> {
        let failed = |message: String| Setup::Failed(ExternalError::Protocol { method, message });
        let stall = self.stall();
        let mut exited = self.exited.clone();
        tokio::select! {
            biased;
            () = self.turn.cancel.cancelled() => Err(Setup::Interrupted),
            answer = tokio::time::timeout(stall, request) => match answer {
                Ok(Ok(answer)) => Ok(answer),
                Ok(Err(e)) => Err(failed(e.to_string())),
                Err(_) => Err(failed(format!("no answer within {} s", stall.as_secs()))),
            },
            status = wait_exit(&mut exited) => Err(failed(format!("the agent exited ({status})"))),
        }
    }

    /// Drops the messages received so far; a permission asked meanwhile is cancelled.
    fn drop_pending(&mut self) {
        while let Ok(event) = self.received.try_recv() {
            if let Event::Permission(_, responder) = event {
                let _ = responder.respond(cancelled());
            }
        }
    }

    /// `session/prompt` and the turn's updates until its answer.
    async fn prompt(&mut self, session: SessionId) -> TurnEnd {
        let turn = self.turn;
        let agent = turn.agent;
        let mut recorder = Recorder::new(turn.store);
        let request = PromptRequest::new(
            session.clone(),
            vec![ContentBlock::Text(TextContent::new(turn.input.clone()))],
        );
        let mut answer = Box::pin(self.cx.send_request(request).block_task());
        let mut asking: FuturesUnordered<BoxFuture<'_, (u64, PromptAnswer)>> =
            FuturesUnordered::new();
        let mut waiting: HashMap<u64, (Responder<RequestPermissionResponse>, Ask)> = HashMap::new();
        let mut next_ask = 0u64;
        let mut stop_by: Option<Instant> = None;
        // Half the grace: the owner gives the worker the whole of it to settle the turn
        // before it kills the worker and the turn becomes `unknown`.
        let grace = Duration::from_secs_f64(agent.interrupt_grace_s.clamp(0.0, 3600.0) / 2.0);
        self.heard.touch();
        let store_failed = |e: StoreError| TurnEnd::Settled(failed(agent, e.message));
        let answered: Result<PromptResponse, agent_client_protocol::Error> = loop {
            let stalled_at = self.heard.last() + self.stall();
            tokio::select! {
                biased;
                () = turn.cancel.cancelled(), if stop_by.is_none() => {
                    tracing::info!(agent = %agent.name, "interrupting the agent (session/cancel)");
                    if let Err(e) = self.cx.send_notification(CancelNotification::new(session.clone())) {
                        tracing::warn!(error = %e, "session/cancel could not be sent");
                    }
                    // ACP: the client answers every pending permission `cancelled`.
                    for (_, (responder, _)) in waiting.drain() {
                        let _ = responder.respond(cancelled());
                    }
                    asking.clear();
                    stop_by = Some(Instant::now() + grace);
                }
                answer = &mut answer => break answer,
                event = self.received.recv() => match event {
                    Some(Event::Update(update)) if update.session_id == session => {
                        if let Err(e) = recorder.update(update.update).await {
                            return store_failed(e);
                        }
                    }
                    Some(Event::Update(_)) => {}
                    Some(Event::Permission(request, responder)) => {
                        if stop_by.is_some() || request.session_id != session {
                            let _ = responder.respond(cancelled());
                            continue;
                        }
                        let ask = Ask::new(&agent.name, &request);
                        if let Err(e) = recorder.asked(request.tool_call).await {
                            let _ = responder.respond(cancelled());
                            return store_failed(e);
                        }
                        let granted = turn.grants.contains(&ask.pattern_key);
                        if let Some(response) = ask.without_prompt(turn.approvals.get(), granted) {
                            let _ = responder.respond(response);
                            continue;
                        }
                        next_ask += 1;
                        let id = next_ask;
                        let body = ask.body.clone();
                        let prompts = turn.prompts;
                        asking.push(async move { (id, prompts.open("approval", body).await) }.boxed());
                        waiting.insert(id, (responder, ask));
                    }
                    // The handlers are gone only with the connection.
                    None => break Err(agent_client_protocol::Error::internal_error()),
                },
                Some((id, human)) = asking.next(), if !asking.is_empty() => {
                    if let Some((responder, ask)) = waiting.remove(&id) {
                        let (response, grants) = ask.answer(&human);
                        if grants {
                            turn.grants.insert(&ask.pattern_key);
                        }
                        tracing::info!(agent = %agent.name, pattern_key = %ask.pattern_key, answer = ?human, "permission answered");
                        let _ = responder.respond(response);
                    }
                    // The agent was waiting on us, not silent.
                    self.heard.touch();
                }
                () = sleep_until(stop_by) => {
                    tracing::warn!(agent = %agent.name, grace_s = grace.as_secs_f64(), "the agent did not stop within the grace; stopping its process group");
                    return self.settle(recorder, Ok(PromptResponse::new(StopReason::Cancelled)), true).await;
                }
                () = tokio::time::sleep_until(stalled_at), if stop_by.is_none() && waiting.is_empty() => {
                    if self.heard.last() + self.stall() <= Instant::now() {
                        let _ = recorder.flush().await;
                        return TurnEnd::Lost(format!(
                            "agent_stalled: the agent sent nothing for {} s",
                            self.stall().as_secs()
                        ));
                    }
                }
                status = wait_exit(&mut self.exited) => {
                    // Its answer may still be in the pipe.
                    match tokio::time::timeout(LAST_WORDS, &mut answer).await {
                        Ok(Ok(answer)) => break Ok(answer),
                        _ => {
                            while let Ok(Event::Update(update)) = self.received.try_recv() {
                                if update.session_id == session {
                                    let _ = recorder.update(update.update).await;
                                }
                            }
                            let _ = recorder.flush().await;
                            return TurnEnd::Lost(format!("agent_lost: the agent exited mid-turn ({status})"));
                        }
                    }
                }
            }
        };
        // Updates sent before the answer were received before it.
        while let Ok(event) = self.received.try_recv() {
            match event {
                Event::Update(update) if update.session_id == session => {
                    if let Err(e) = recorder.update(update.update).await {
                        return store_failed(e);
                    }
                }
                Event::Update(_) => {}
                Event::Permission(_, responder) => {
                    let _ = responder.respond(cancelled());
                }
            }
        }
        for (_, (responder, _)) in waiting.drain() {
            let _ = responder.respond(cancelled());
        }
        if let Err(e) = &answered {
            if is_incoming_transport_closed(e) || is_connection_terminated(e) {
                let _ = recorder.flush().await;
                return TurnEnd::Lost(format!(
                    "agent_lost: the agent's connection closed mid-turn: {e}"
                ));
            }
        }
        self.settle(recorder, answered, false).await
    }

    /// The turn's end from the prompt's answer: usage, open calls, the last text.
    async fn settle(
        &self,
        mut recorder: Recorder<'_>,
        answered: Result<PromptResponse, agent_client_protocol::Error>,
        killed: bool,
    ) -> TurnEnd {
        let agent = self.turn.agent;
        let (outcome, error, usage) = match answered {
            Ok(answer) => {
                // An agent that reports no usage with its answer (codex-acp) may have said how
                // full its context is: its last request read and wrote at least that much.
                let usage = answer
                    .usage
                    .map(|u| Usage {
                        input_tokens: u.input_tokens,
                        output_tokens: u.output_tokens,
                        total_tokens: u.total_tokens,
                    })
                    .or_else(|| {
                        recorder.context_used().map(|used| Usage {
                            input_tokens: used,
                            output_tokens: 0,
                            total_tokens: used,
                        })
                    });
                let (outcome, error) = match answer.stop_reason {
                    StopReason::EndTurn => (TurnOutcome::Completed, None),
                    StopReason::Cancelled => (TurnOutcome::Interrupted, None),
                    StopReason::MaxTokens => (TurnOutcome::Failed, Some("max_tokens".to_string())),
                    StopReason::MaxTurnRequests => {
                        (TurnOutcome::Failed, Some("max_turn_requests".to_string()))
                    }
                    StopReason::Refusal => (TurnOutcome::Failed, Some("refusal".to_string())),
                    other => (TurnOutcome::Failed, Some(format!("{other:?}"))),
                };
                (outcome, error, usage.unwrap_or_default())
            }
            Err(e) => (
                TurnOutcome::Failed,
                Some(format!("the agent answered the prompt with an error: {e}")),
                Usage::default(),
            ),
        };
        let error = match (killed, error) {
            (true, _) => Some(format!(
                "the agent did not stop within {} s of session/cancel; its process group was killed",
                agent.interrupt_grace_s / 2.0
            )),
            (false, error) => error,
        };
        let write = async {
            self.turn
                .store
                .add_usage(UsageAdd {
                    input_tokens: usage.input_tokens,
                    output_tokens: usage.output_tokens,
                    total_tokens: usage.total_tokens,
                    api_calls: 1,
                    ..UsageAdd::default()
                })
                .await?;
            let open = if outcome == TurnOutcome::Interrupted {
                INTERRUPTED_RESULT
            } else {
                NO_RESULT
            };
            recorder.end(open).await
        };
        if let Err(e) = write.await {
            return TurnEnd::Settled(failed(agent, e.message));
        }
        tracing::info!(agent = %agent.name, outcome = outcome.as_str(), "agent turn ended");
        let mut report = report(agent, outcome, recorder.final_response().to_string(), error);
        report.usage = usage;
        report.api_calls = 1;
        TurnEnd::Settled(report)
    }
}

/// Waits for the agent's exit and gives its status.
async fn wait_exit(exited: &mut tokio::sync::watch::Receiver<Option<String>>) -> String {
    match exited.wait_for(Option::is_some).await {
        Ok(status) => status.clone().unwrap_or_default(),
        Err(_) => "unknown".to_string(),
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

fn report(
    agent: &ExternalAgent,
    outcome: TurnOutcome,
    final_response: String,
    error: Option<String>,
) -> TurnReport {
    TurnReport {
        outcome,
        final_response,
        model: agent.name.clone(),
        usage: Usage::default(),
        api_calls: 0,
        error,
    }
}

fn failed(agent: &ExternalAgent, error: String) -> TurnReport {
    report(agent, TurnOutcome::Failed, String::new(), Some(error))
}
