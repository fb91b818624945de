//! One ACP client's connection to the daemon: the sessions it attached, each followed by a
//! pump that turns the session's drover events into `session/update`s and its open prompts
//! into `session/request_permission`s.
//!
//! Everything durable stays in the daemon: a turn belongs to it, not to this connection, so
//! this connection going away (or this process dying) stops nothing; a new one that resumes
//! or loads the session asks every open prompt again and follows the turn from there.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use agent_client_protocol::v1::schema::{
    ContentBlock, EmbeddedResourceResource, PromptRequest, PromptResponse,
    RequestPermissionOutcome, RequestPermissionRequest, SessionId, SessionNotification,
    SessionUpdate, StopReason, ToolCallStatus, ToolCallUpdate, ToolCallUpdateFields, ToolKind,
    Usage, UsageUpdate,
};
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::{Client as AcpClient, Error as AcpRpcError};
use drover_client::{Client, ClientError, ConnectOptions, SessionStream, StartDaemon, Update};
use drover_protocol::client::SessionSnapshot;
use drover_protocol::event::{EventPayload, TurnEnd};
use drover_protocol::words::{AdmissionStatus, ApprovalChoice, ClarifyAnswer, OpenPrompt};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::map;

/// How many settlements of turns no prompt of this connection waits for are kept (a turn
/// can settle before `prompt.submit`'s answer is read).
const SETTLED_KEPT: usize = 64;

/// The context window drover budgets with when neither `[model] context_window` nor the
/// endpoint says (docs/configuration.md).
const DEFAULT_CONTEXT_WINDOW: u64 = 128_000;

/// How long a `session/prompt` answer waits for its turn's usage.
const USAGE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The answer to "resolve the unknown turn and go on?".
enum Offer {
    Resolve,
    Keep,
    Cancelled,
}

/// How a turn ended, as `turn.settled` says.
#[derive(Debug, Clone)]
pub(crate) struct Settled {
    pub outcome: TurnEnd,
    pub error: Option<String>,
}

/// What the pump knows of a session's running turn.
#[derive(Default)]
struct TurnView {
    /// The newest turn's generation (for `session.interrupt` and prompt answers).
    generation: u64,
    /// Tool calls started and not finished, in order.
    open_tools: Vec<String>,
    /// Text streamed since the last tool call, so the final message adds only what is missing.
    streamed: String,
    /// `session/prompt`s waiting for their turn's end, by admission.
    waiters: HashMap<String, oneshot::Sender<Settled>>,
    /// Turns that ended with nobody waiting yet.
    settled: VecDeque<(String, Settled)>,
    /// Prompts asked of the ACP client and not answered yet.
    asked: HashSet<String>,
    /// The session's admission whose outcome is unknown, if any.
    unknown: Option<String>,
}

/// One attached session.
pub(crate) struct Attached {
    pub session_id: String,
    pub cwd: PathBuf,
    /// The approval mode the session's turns get, as the snapshot said.
    pub approval_mode: Option<drover_protocol::ApprovalMode>,
    /// The session's context window, as the snapshot said.
    context_window: Option<u64>,
    view: Mutex<TurnView>,
    pump: Mutex<Option<JoinHandle<()>>>,
}

impl Attached {
    fn view(&self) -> MutexGuard<'_, TurnView> {
        // A panic while holding the lock leaves plain data behind: go on with it.
        self.view.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The session's context window in tokens: drover's default when neither the config nor
    /// the endpoint said.
    fn context_window(&self) -> u64 {
        self.context_window
            .filter(|w| *w > 0)
            .unwrap_or(DEFAULT_CONTEXT_WINDOW)
    }

    fn stop_pump(&self) {
        if let Some(pump) = self.pump.lock().unwrap_or_else(|e| e.into_inner()).take() {
            pump.abort();
        }
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        self.stop_pump();
    }
}

/// The ACP connection's state: the daemon client and the attached sessions.
pub(crate) struct Bridge {
    pub client: Client,
    /// How this process reaches the daemon (whether it may start one).
    options: ConnectOptions,
    pub acp: ConnectionTo<AcpClient>,
    /// Whether the client takes elicitation forms (its `initialize` said so): clarify
    /// questions are asked as forms, free text included.
    pub forms: std::sync::atomic::AtomicBool,
    sessions: Mutex<HashMap<String, Arc<Attached>>>,
}

/// A drover client error as an ACP error: the daemon's reason and message travel in `data`.
pub(crate) fn rpc_error(e: ClientError) -> AcpRpcError {
    match &e {
        ClientError::Rpc { error: rpc, .. } => {
            // The ACP code for drover's reason; the daemon's `data` (reason, detail, field)
            // goes along, and the message is its sentence.
            let code = match rpc.message.as_str() {
                "invalid_params" => -32602,
                "not_found" => -32002,
                _ => -32603,
            };
            let detail = rpc
                .data
                .get("detail")
                .and_then(serde_json::Value::as_str)
                .filter(|d| !d.is_empty())
                .unwrap_or(&rpc.message);
            AcpRpcError::new(code, detail.to_string()).data(rpc.data.clone())
        }
        _ => AcpRpcError::new(-32603, e.to_string()),
    }
}

impl Bridge {
    pub fn new(
        client: Client,
        options: ConnectOptions,
        acp: ConnectionTo<AcpClient>,
    ) -> Arc<Bridge> {
        Arc::new(Bridge {
            client,
            options,
            acp,
            forms: std::sync::atomic::AtomicBool::new(false),
            sessions: Mutex::new(HashMap::new()),
        })
    }

    fn sessions(&self) -> MutexGuard<'_, HashMap<String, Arc<Attached>>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the home's daemon when none runs and this process may start one: a daemon
    /// someone stopped is not started again by the connection on its own (docs/chat.md), but a
    /// new request from the editor is a person asking, as a new `drover` command would be.
    /// The connection then finds the new daemon by itself.
    pub async fn wake_daemon(&self) {
        if !matches!(self.options.start, StartDaemon::Spawn { .. })
            || drover_client::owner_pid(&self.options.home).is_some()
        {
            return;
        }
        if let Err(e) = Client::connect(self.options.clone()).await {
            tracing::warn!(error = %e, "cannot start the daemon");
        }
    }

    pub fn attached(&self, session_id: &str) -> Option<Arc<Attached>> {
        self.sessions().get(session_id).cloned()
    }

    /// Sends one update of `session_id`; a closed ACP connection drops it (the daemon keeps
    /// the turn, and a later resume picks it up).
    fn send(&self, session_id: &str, update: SessionUpdate) {
        let note = SessionNotification::new(SessionId::new(session_id.to_string()), update);
        if let Err(e) = self.acp.send_notification(note) {
            tracing::debug!(error = %e, "session/update not sent");
        }
    }

    /// The tool calls of a session that ended as errors (a denied command, a failed tool), from
    /// its stored `tool.complete` events up to the snapshot: the transcript does not say.
    pub async fn failed_calls(
        &self,
        snapshot: &SessionSnapshot,
    ) -> Result<HashSet<String>, ClientError> {
        let mut failed = HashSet::new();
        let mut last = 0;
        while last < snapshot.last_sequence {
            let page = self
                .client
                .events_since(
                    &snapshot.session_id,
                    Some(&snapshot.replay_epoch),
                    last,
                    None,
                )
                .await?;
            if page.snapshot_required || page.events.is_empty() {
                break;
            }
            for event in page.events {
                last = event.seq.unwrap_or(last).max(last);
                if let EventPayload::ToolComplete(done) = event.event {
                    if done.is_error {
                        failed.insert(done.tool_id);
                    }
                }
            }
            if !page.has_more {
                break;
            }
        }
        Ok(failed)
    }

    /// Starts following `stream` (a session just created, resumed or loaded): the snapshot's
    /// state first (with `replay`, the whole transcript as updates, the calls in it that
    /// failed marked so), then every open prompt asked again, then the events as they come.
    pub fn follow(
        self: &Arc<Self>,
        stream: SessionStream,
        replay: Option<HashSet<String>>,
    ) -> Arc<Attached> {
        let snapshot = stream.snapshot().clone();
        let attached = Arc::new(Attached {
            session_id: snapshot.session_id.clone(),
            cwd: PathBuf::from(&snapshot.info.cwd),
            approval_mode: snapshot.info.approval_mode,
            context_window: snapshot.info.context_window,
            view: Mutex::new(TurnView::default()),
            pump: Mutex::new(None),
        });
        let replayed = replay.is_some();
        if let Some(failed) = replay {
            for update in map::replay(&snapshot.messages, &attached.cwd, snapshot.running, &failed)
            {
                self.send(&attached.session_id, update);
            }
            if snapshot
                .pending
                .iter()
                .any(|p| p.status == AdmissionStatus::Unknown)
            {
                self.send(
                    &attached.session_id,
                    map::agent_text(map::UNKNOWN_NOTE.trim_start()),
                );
            }
        }
        // The running turn's calls in flight: a prompt asked again names its call, and a client
        // that resumed (no replay) is shown the call before its end arrives.
        if snapshot.running {
            let open = map::open_calls(&snapshot.messages, &attached.cwd);
            if !replayed {
                for call in &open {
                    self.send(&attached.session_id, SessionUpdate::ToolCall(call.clone()));
                }
            }
            attached.view().open_tools =
                open.iter().map(|c| c.tool_call_id.0.to_string()).collect();
        }
        self.take_snapshot(&attached, &snapshot);
        let previous = self
            .sessions()
            .insert(attached.session_id.clone(), attached.clone());
        if let Some(previous) = previous {
            previous.stop_pump();
        }
        let pump = tokio::spawn(self.clone().pump(attached.clone(), stream));
        *attached.pump.lock().unwrap_or_else(|e| e.into_inner()) = Some(pump);
        attached
    }

    /// Stops following a session (`session/close`): the daemon keeps it and its turns.
    pub fn forget(&self, session_id: &str) -> Option<Arc<Attached>> {
        let attached = self.sessions().remove(session_id);
        if let Some(a) = &attached {
            a.stop_pump();
        }
        attached
    }

    /// A snapshot's state: the generation, the unknown admission, and its open prompts asked.
    fn take_snapshot(self: &Arc<Self>, attached: &Arc<Attached>, snapshot: &SessionSnapshot) {
        {
            let mut view = attached.view();
            view.generation = snapshot.execution_generation;
            view.unknown = snapshot
                .pending
                .iter()
                .find(|p| p.status == AdmissionStatus::Unknown)
                .map(|p| p.admission_id.clone());
            // A waiter whose admission is no longer pending ended while the connection was
            // down with no event to say how: its receipt does.
            let pending: HashSet<&str> = snapshot
                .pending
                .iter()
                .map(|p| p.admission_id.as_str())
                .collect();
            let gone: Vec<String> = view
                .waiters
                .keys()
                .filter(|a| !pending.contains(a.as_str()))
                .cloned()
                .collect();
            for admission_id in gone {
                if let Some(waiter) = view.waiters.remove(&admission_id) {
                    let bridge = self.clone();
                    let session_id = attached.session_id.clone();
                    tokio::spawn(async move {
                        let settled = bridge.settlement_of(&session_id, &admission_id).await;
                        let _ = waiter.send(settled);
                    });
                }
            }
        }
        for prompt in &snapshot.prompts {
            self.ask(attached, prompt.clone());
        }
    }

    /// How an admission ended, from its receipt.
    async fn settlement_of(&self, session_id: &str, admission_id: &str) -> Settled {
        match self.client.receipt(session_id, admission_id, true).await {
            Ok(receipt) => Settled {
                outcome: match receipt.outcome {
                    Some(o) => turn_end(o),
                    None if receipt.status == AdmissionStatus::Unknown => TurnEnd::Unknown,
                    None => TurnEnd::Failed,
                },
                error: receipt.result.and_then(|r| r.error),
            },
            Err(e) => Settled {
                outcome: TurnEnd::Failed,
                error: Some(e.to_string()),
            },
        }
    }

    /// Follows the session's events until the stream ends.
    async fn pump(self: Arc<Self>, attached: Arc<Attached>, mut stream: SessionStream) {
        while let Some(update) = stream.next().await {
            match update {
                Ok(Update::Event(event)) => self.on_event(&attached, event.event),
                Ok(Update::Snapshot(snapshot)) => self.take_snapshot(&attached, &snapshot),
                Ok(Update::Connection(change)) => {
                    tracing::info!(session = %attached.session_id, "{change}");
                }
                Err(e) => {
                    tracing::warn!(session = %attached.session_id, error = %e, "session stream ended");
                    let waiters: Vec<_> = attached.view().waiters.drain().collect();
                    for (_, waiter) in waiters {
                        let _ = waiter.send(Settled {
                            outcome: TurnEnd::Failed,
                            error: Some(format!("lost the daemon: {e}")),
                        });
                    }
                    return;
                }
            }
        }
    }

    fn on_event(self: &Arc<Self>, attached: &Arc<Attached>, event: EventPayload) {
        let id = attached.session_id.as_str();
        match event {
            EventPayload::TurnStarted(started) => {
                let mut view = attached.view();
                view.generation = started.execution_generation;
                view.streamed.clear();
                view.open_tools.clear();
            }
            EventPayload::MessageDelta(delta) => {
                attached.view().streamed.push_str(&delta.text);
                self.send(id, map::agent_text(delta.text));
            }
            EventPayload::MessageComplete(complete) => {
                let rest = {
                    let mut view = attached.view();
                    let rest = match complete.text.strip_prefix(view.streamed.as_str()) {
                        Some(rest) => rest.to_string(),
                        // Streamed text that is not the final one's start (a reconnect in
                        // between): the final text was shown in pieces already.
                        None => String::new(),
                    };
                    view.streamed.clear();
                    rest
                };
                if !rest.is_empty() {
                    self.send(id, map::agent_text(rest));
                }
            }
            EventPayload::ToolStart(start) => {
                {
                    let mut view = attached.view();
                    view.streamed.clear();
                    view.open_tools.push(start.tool_id.clone());
                }
                self.send(
                    id,
                    SessionUpdate::ToolCall(map::tool_started(&start, &attached.cwd)),
                );
            }
            EventPayload::ToolComplete(done) => {
                attached.view().open_tools.retain(|t| t != &done.tool_id);
                if done.name.as_deref() == Some("todo") {
                    if let Some(plan) = map::plan(&done.result) {
                        self.send(id, SessionUpdate::Plan(plan));
                    }
                }
                self.send(
                    id,
                    SessionUpdate::ToolCallUpdate(map::tool_completed(&done, &attached.cwd)),
                );
            }
            EventPayload::ApprovalRequest(prompt) | EventPayload::ClarifyRequest(prompt) => {
                self.ask(attached, prompt);
            }
            EventPayload::ApprovalSettled(settled) => {
                attached.view().asked.remove(&settled.prompt_id);
            }
            EventPayload::ClarifySettled(settled) => {
                attached.view().asked.remove(&settled.prompt_id);
            }
            EventPayload::TurnSettled(settled) => {
                self.settle(
                    attached,
                    &settled.admission_id,
                    Settled {
                        outcome: settled.outcome,
                        error: settled.error,
                    },
                );
            }
            EventPayload::AdmissionUpdated(updated) => match updated.status {
                AdmissionStatus::Unknown => {
                    let first = attached
                        .view()
                        .unknown
                        .replace(updated.admission_id.clone());
                    if first.as_deref() != Some(updated.admission_id.as_str()) {
                        self.settle(
                            attached,
                            &updated.admission_id,
                            Settled {
                                outcome: TurnEnd::Unknown,
                                error: None,
                            },
                        );
                    }
                }
                AdmissionStatus::Terminal => {
                    let mut view = attached.view();
                    if view.unknown.as_deref() == Some(updated.admission_id.as_str()) {
                        view.unknown = None;
                    }
                }
                _ => {}
            },
            _ => {}
        }
    }

    /// A turn ended: its open tool calls are closed, an unknown outcome is said, and the
    /// `session/prompt` waiting for it answers.
    fn settle(&self, attached: &Attached, admission_id: &str, settled: Settled) {
        let id = attached.session_id.as_str();
        let open: Vec<String> = std::mem::take(&mut attached.view().open_tools);
        let why = match settled.outcome {
            TurnEnd::Unknown => "outcome unknown: the turn stopped while this call ran, and drover did not run it again",
            TurnEnd::Interrupted | TurnEnd::Cancelled => "interrupted",
            _ => "the turn ended before this call finished",
        };
        for tool_id in open {
            self.send(
                id,
                SessionUpdate::ToolCallUpdate(map::tool_abandoned(&tool_id, why)),
            );
        }
        if settled.outcome == TurnEnd::Unknown {
            attached.view().unknown = Some(admission_id.to_string());
            self.send(id, map::agent_text(map::UNKNOWN_NOTE));
        }
        let mut view = attached.view();
        match view.waiters.remove(admission_id) {
            Some(waiter) => {
                let _ = waiter.send(settled);
            }
            None => {
                view.settled.push_back((admission_id.to_string(), settled));
                while view.settled.len() > SETTLED_KEPT {
                    view.settled.pop_front();
                }
            }
        }
    }

    /// Asks the ACP client an open prompt (once per connection), and applies its answer.
    fn ask(self: &Arc<Self>, attached: &Arc<Attached>, prompt: OpenPrompt) {
        let prompt_id = match &prompt {
            OpenPrompt::Approval(p) => p.prompt_id.clone(),
            OpenPrompt::Clarify(p) => p.prompt_id.clone(),
            OpenPrompt::Budget(p) => p.prompt_id.clone(),
        };
        let tool_id = {
            let mut view = attached.view();
            if !view.asked.insert(prompt_id.clone()) {
                return;
            }
            view.open_tools.last().cloned()
        };
        let bridge = self.clone();
        let attached = attached.clone();
        tokio::spawn(async move {
            let session_id = attached.session_id.clone();
            let answered = bridge.ask_and_answer(&session_id, tool_id, &prompt).await;
            if let Err(e) = answered {
                tracing::warn!(session = %session_id, prompt = %prompt_id, error = %e, "prompt not answered");
            }
            attached.view().asked.remove(&prompt_id);
        });
    }

    async fn ask_and_answer(
        &self,
        session_id: &str,
        tool_id: Option<String>,
        prompt: &OpenPrompt,
    ) -> Result<(), String> {
        let (prompt_id, title, kind, options) = match prompt {
            OpenPrompt::Budget(p) => {
                // ACP v1 has no amount to answer with: drover's own clients raise the limit.
                let limit = p.limit_usd.map_or("-".to_string(), |l| format!("{l:.2}"));
                self.send(
                    session_id,
                    map::agent_text(format!(
                        "\n[drover paused the turn: spend limit reached ({:.2} of {limit} USD); raise it with `drover budget {session_id} --add-usd N`]\n",
                        p.spent_usd
                    )),
                );
                return Ok(());
            }
            OpenPrompt::Approval(p) => (
                &p.prompt_id,
                format!("{} ({})", p.command, p.description),
                ToolKind::Execute,
                map::approval_options(p),
            ),
            OpenPrompt::Clarify(p) if self.forms.load(std::sync::atomic::Ordering::Relaxed) => {
                let form = map::clarify_form(p, session_id, tool_id);
                let response = self
                    .acp
                    .send_request(form)
                    .block_task()
                    .await
                    .map_err(|e| e.to_string())?;
                // Declined or cancelled: the question stays open for another client.
                let Some(answer) = map::clarify_form_answer(&response) else {
                    return Ok(());
                };
                return self
                    .client
                    .respond_clarify(session_id, p.execution_generation, &p.prompt_id, answer)
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string());
            }
            OpenPrompt::Clarify(p) => {
                if p.choices.is_empty() {
                    // ACP v1 has no free-text answer: drover's own clients answer it.
                    self.send(
                        session_id,
                        map::agent_text(format!(
                            "\n[drover asks: {} (answer from `drover answer {session_id} --text ...`, the chat or the dashboard)]\n",
                            p.question
                        )),
                    );
                    return Ok(());
                }
                (
                    &p.prompt_id,
                    p.question.clone(),
                    ToolKind::Think,
                    map::clarify_options(p),
                )
            }
        };
        let tool_call = ToolCallUpdate::new(
            tool_id.unwrap_or_else(|| format!("prompt:{prompt_id}")),
            ToolCallUpdateFields::new()
                .title(title)
                .kind(kind)
                .status(ToolCallStatus::Pending),
        );
        let request = RequestPermissionRequest::new(
            SessionId::new(session_id.to_string()),
            tool_call,
            options,
        );
        let response = self
            .acp
            .send_request(request)
            .block_task()
            .await
            .map_err(|e| e.to_string())?;
        let option_id = match response.outcome {
            RequestPermissionOutcome::Selected(selected) => selected.option_id.0.to_string(),
            // Cancelled (the client cancelled the turn, or closed): the prompt stays open in
            // the daemon for another client, or until the interrupt closes it.
            _ => return Ok(()),
        };
        let generation = match prompt {
            OpenPrompt::Approval(p) => p.execution_generation,
            OpenPrompt::Clarify(p) => p.execution_generation,
            OpenPrompt::Budget(_) => return Ok(()),
        };
        let answered = match prompt {
            OpenPrompt::Approval(p) => {
                let choice = map::approval_choice(&option_id)
                    .ok_or_else(|| format!("unknown option {option_id:?}"))?;
                // The scope the option's name promised, not the daemon's default.
                let scope = (choice == ApprovalChoice::Always).then(|| map::always_scope(p).0);
                self.client
                    .respond_approval_scoped(session_id, generation, &p.prompt_id, choice, scope)
                    .await
            }
            OpenPrompt::Clarify(p) => {
                let choice = map::clarify_choice(p, &option_id)
                    .ok_or_else(|| format!("unknown option {option_id:?}"))?;
                self.client
                    .respond_clarify(
                        session_id,
                        generation,
                        &p.prompt_id,
                        ClarifyAnswer::Text(choice.to_string()),
                    )
                    .await
            }
            OpenPrompt::Budget(_) => return Ok(()),
        };
        answered.map(drop).map_err(|e| e.to_string())
    }

    /// `session/prompt`: offers to resolve an unknown turn first, submits, and answers when the
    /// turn ends.
    pub async fn prompt(
        self: &Arc<Self>,
        attached: Arc<Attached>,
        request: PromptRequest,
    ) -> Result<PromptResponse, AcpRpcError> {
        let text = prompt_text(&request.prompt)?;
        self.wake_daemon().await;
        let unknown = attached.view().unknown.clone();
        if let Some(admission_id) = unknown {
            match self.offer_resolve(&attached, &admission_id).await? {
                Offer::Resolve => {
                    self.client
                        .resolve_unknown(&attached.session_id, &admission_id)
                        .await
                        .map_err(rpc_error)?;
                    attached.view().unknown = None;
                }
                // Queued behind the unknown turn: it runs once someone resolves it.
                Offer::Keep => {}
                // The person cancelled the prompt itself: nothing is submitted.
                Offer::Cancelled => return Ok(PromptResponse::new(StopReason::Cancelled)),
            }
        }
        let receipt = self
            .client
            .submit(&attached.session_id, &text)
            .await
            .map_err(rpc_error)?;
        let waiting = {
            let mut view = attached.view();
            match view
                .settled
                .iter()
                .position(|(a, _)| a == &receipt.admission_id)
            {
                Some(i) => Err(view.settled.remove(i).map(|(_, s)| s)),
                None => {
                    let (tx, rx) = oneshot::channel();
                    view.waiters.insert(receipt.admission_id.clone(), tx);
                    Ok(rx)
                }
            }
        };
        let settled = match waiting {
            Ok(rx) => rx.await.map_err(|_| {
                AcpRpcError::new(
                    -32603,
                    "the session stopped being followed before the turn ended",
                )
            })?,
            Err(Some(settled)) => settled,
            Err(None) => {
                self.settlement_of(&attached.session_id, &receipt.admission_id)
                    .await
            }
        };
        let stop = map::stop_reason(settled.outcome, settled.error.as_deref())
            .map_err(|message| AcpRpcError::new(-32603, message))?;
        let mut response = PromptResponse::new(stop);
        // The usage is a courtesy: an answer waits for it only briefly (a daemon that is
        // stopping may not answer at all, and the turn has ended either way).
        let usage = tokio::time::timeout(
            USAGE_WAIT,
            self.client
                .receipt(&attached.session_id, &receipt.admission_id, true),
        )
        .await;
        if let Ok(Ok(receipt)) = usage {
            if let Some(usage) = receipt.usage {
                response = response.usage(Usage::new(
                    usage.total_tokens,
                    usage.input_tokens,
                    usage.output_tokens,
                ));
                let api_calls = receipt.result.map_or(1, |r| r.api_calls).max(1);
                let used = (usage.input_tokens + usage.output_tokens).div_ceil(api_calls);
                self.send(
                    &attached.session_id,
                    SessionUpdate::UsageUpdate(UsageUpdate::new(used, attached.context_window())),
                );
            }
        }
        Ok(response)
    }

    /// Asks whether to resolve the unknown turn and go on.
    async fn offer_resolve(
        &self,
        attached: &Attached,
        admission_id: &str,
    ) -> Result<Offer, AcpRpcError> {
        let tool_call = ToolCallUpdate::new(
            format!("resolve:{admission_id}"),
            ToolCallUpdateFields::new()
                .title("The last turn's outcome is unknown (drover did not run it again). Resolve it and go on?".to_string())
                .kind(ToolKind::Other)
                .status(ToolCallStatus::Pending),
        );
        let request = RequestPermissionRequest::new(
            SessionId::new(attached.session_id.clone()),
            tool_call,
            map::resolve_options(),
        );
        let response = self.acp.send_request(request).block_task().await?;
        Ok(match response.outcome {
            RequestPermissionOutcome::Selected(s) if &*s.option_id.0 == map::RESOLVE_OPTION => {
                Offer::Resolve
            }
            RequestPermissionOutcome::Selected(_) => Offer::Keep,
            _ => Offer::Cancelled,
        })
    }

    /// `session/cancel`: interrupts the running turn and cancels this connection's prompts
    /// still queued behind it; each `session/prompt` then answers `cancelled`.
    pub async fn cancel(&self, attached: &Attached) {
        let (generation, waiting) = {
            let view = attached.view();
            (
                view.generation,
                view.waiters.keys().cloned().collect::<Vec<_>>(),
            )
        };
        if let Err(e) = self
            .client
            .interrupt(&attached.session_id, generation)
            .await
        {
            tracing::info!(session = %attached.session_id, error = %e, "cancel: nothing to interrupt");
        }
        for admission_id in waiting {
            // A started admission refuses (`stale_generation`): the interrupt covers it.
            if self
                .client
                .cancel(&attached.session_id, &admission_id)
                .await
                .is_ok()
            {
                self.settle(
                    attached,
                    &admission_id,
                    Settled {
                        outcome: TurnEnd::Cancelled,
                        error: None,
                    },
                );
            }
        }
    }
}

/// The prompt's content as the text drover submits: text as it is, an embedded resource as a
/// block naming its URI, a link as its URI. Images and audio are refused (the capabilities say
/// so).
pub(crate) fn prompt_text(blocks: &[ContentBlock]) -> Result<String, AcpRpcError> {
    let mut text = String::new();
    for block in blocks {
        if !text.is_empty() {
            text.push('\n');
        }
        match block {
            ContentBlock::Text(t) => text.push_str(&t.text),
            ContentBlock::ResourceLink(link) => text.push_str(&format!("[{}]({})", link.name, link.uri)),
            ContentBlock::Resource(resource) => match &resource.resource {
                EmbeddedResourceResource::TextResourceContents(contents) => text.push_str(
                    &format!("<context uri=\"{}\">\n{}\n</context>", contents.uri, contents.text),
                ),
                _ => {
                    return Err(AcpRpcError::invalid_params()
                        .data(serde_json::json!({"field": "prompt", "reason": "binary resources are not supported"})))
                }
            },
            _ => {
                return Err(AcpRpcError::invalid_params().data(
                    serde_json::json!({"field": "prompt", "reason": "only text and embedded text resources are supported"}),
                ))
            }
        }
    }
    if text.trim().is_empty() {
        return Err(AcpRpcError::invalid_params()
            .data(serde_json::json!({"field": "prompt", "reason": "the prompt is empty"})));
    }
    Ok(text)
}

fn turn_end(outcome: drover_protocol::words::AdmissionOutcome) -> TurnEnd {
    use drover_protocol::words::AdmissionOutcome as O;
    match outcome {
        O::Completed => TurnEnd::Completed,
        O::Interrupted => TurnEnd::Interrupted,
        O::Failed => TurnEnd::Failed,
        O::Rejected => TurnEnd::Rejected,
        O::Cancelled => TurnEnd::Cancelled,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn blocks(value: serde_json::Value) -> Vec<ContentBlock> {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_prompt_is_its_text_with_embedded_files_as_context_blocks() {
        let text = prompt_text(&blocks(json!([
            {"type": "text", "text": "Explain this"},
            {"type": "resource", "resource": {"uri": "file:///w/a.rs", "text": "fn a() {}"}},
            {"type": "resource_link", "name": "b.rs", "uri": "file:///w/b.rs"}
        ])))
        .unwrap();
        assert_eq!(
            text,
            "Explain this\n<context uri=\"file:///w/a.rs\">\nfn a() {}\n</context>\n[b.rs](file:///w/b.rs)"
        );
    }

    #[test]
    fn images_and_empty_prompts_are_refused_naming_the_prompt() {
        let image = blocks(json!([{"type": "image", "data": "AAAA", "mimeType": "image/png"}]));
        let refused = prompt_text(&image).unwrap_err();
        assert_eq!(
            refused.code,
            agent_client_protocol::ErrorCode::INVALID_PARAMS
        );
        assert_eq!(refused.data.as_ref().unwrap()["field"], "prompt");
        let empty = prompt_text(&blocks(json!([{"type": "text", "text": "  "}]))).unwrap_err();
        assert!(empty.data.unwrap()["reason"]
            .as_str()
            .unwrap()
            .contains("empty"));
    }
}
