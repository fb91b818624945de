//! Following one submitted turn of `drover run` until it settles: its events, the prompts of
//! its child agents, a quiet stream's receipt, Ctrl-C, and a daemon that dies on the way.

use crate::display::printable;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Result};
use drover_client::{Client, ClientError, ConnectionChange, SessionStream, Update};
use drover_protocol::client::{AdmissionReceipt, AdmissionStatus, ApprovalChoice, OpenPrompt};
use drover_protocol::event::{EventPayload, PromptSettlement, SessionEvent, TurnEnd, TurnPhase};
use drover_protocol::words::AdmissionOutcome;
use tokio::sync::mpsc;

use crate::Exit;

use super::answer::{answer_prompt, Answered, Flags};
use super::output::Output;

/// How often a quiet turn's receipt is read, in case its settlement was missed.
pub(super) const QUIET: Duration = Duration::from_secs(30);

/// How long a `tool.start` line is held back in case an approval prompt follows it.
pub(super) const HOLD_TOOL_LINE: Duration = Duration::from_millis(500);

/// One submitted turn being followed.
pub(super) struct Turn<'a> {
    pub(super) client: &'a Client,
    pub(super) session_id: String,
    pub(super) admission_id: String,
    pub(super) generation: Option<u64>,
    /// Our turn has started: the deltas and tools that follow are ours.
    pub(super) mine: bool,
    pub(super) interrupts: u32,
    /// An approval prompt of ours is open: its held `tool.start` line waits for the answer.
    pub(super) awaiting_approval: bool,
    /// The prompts of child agents, once a `delegate_task` of ours started.
    pub(super) children: Option<ChildPrompts>,
    pub(super) flags: Flags,
    pub(super) out: Output,
    pub(super) streamed: Streamed,
}

/// The current assistant message's streamed text as printed. `message.delta` is live only,
/// so deltas sent while the client was away (a dropped connection, a daemon handoff) are
/// missed: from the first hole on, the message's deltas are not printed, and its
/// `message.complete` prints what the stream did not.
#[derive(Debug, Default)]
pub(super) struct Streamed {
    /// The text printed from this message's deltas, with no hole.
    text: String,
    /// The `delta_index` the next delta has when none was missed.
    next: u64,
    /// A delta was missed: the rest waits for `message.complete`.
    hole: bool,
    /// The connection changed during the turn: some deltas may be missing at the end too.
    away: bool,
}

impl Streamed {
    /// Whether to print this delta (and keeps it when so).
    fn take(&mut self, delta: &drover_protocol::event::MessageDelta) -> bool {
        if delta.delta_index == 0 {
            self.text.clear();
            self.next = 0;
            self.hole = false;
        }
        if self.hole || delta.delta_index != self.next {
            self.hole = true;
            self.away = true;
            return false;
        }
        self.next += 1;
        self.text.push_str(&delta.text);
        true
    }

    /// A new assistant message follows (after a tool call).
    fn new_message(&mut self) {
        self.text.clear();
        self.next = 0;
        self.hole = false;
    }

    /// What of the final `text` the stream did not print, when some of it may be missing:
    /// the rest after what was printed, or the whole text (on a line of its own) when what was
    /// printed is not its start.
    fn missing<'t>(&self, text: &'t str) -> Option<(bool, &'t str)> {
        if !self.away {
            return None;
        }
        match text.strip_prefix(self.text.as_str()) {
            Some(rest) => Some((false, rest)),
            None => Some((true, text)),
        }
    }
}

/// The open prompts of a turn's child agents, followed since its first `delegate_task`: each
/// is answered here like the turn's own (or left, exit 5, naming the child's session).
pub(super) struct ChildPrompts {
    /// Cleared when the turn ends: the watcher stops.
    pub(super) on: Arc<AtomicBool>,
    pub(super) prompts: mpsc::UnboundedReceiver<(String, OpenPrompt)>,
}

impl ChildPrompts {
    pub(super) fn start(client: &Client, parent: &str) -> ChildPrompts {
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
pub(super) async fn next_child_prompt(
    children: &mut Option<ChildPrompts>,
) -> Option<(String, OpenPrompt)> {
    match children {
        Some(children) => children.prompts.recv().await,
        None => std::future::pending().await,
    }
}

/// Polls for the child sessions of `parent`'s running turn while `on`; attaches to each once
/// and sends its open prompts (those open at the attach, then new ones) with its session id.
pub(super) async fn watch_child_prompts(
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
                            | EventPayload::ClarifyRequest(prompt)
                            | EventPayload::BudgetRequest(prompt) => {
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
    pub(super) async fn follow(
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
                    self.streamed.away = true;
                    self.out.note(&format!(
                        "drover: lost the connection to the daemon ({why}); reconnecting"
                    ));
                    self.out.spinner.wait("the daemon to come back");
                    None
                }
                // A handoff: the turn carries on under the next owner, and the stream catches
                // up with what it stored meanwhile, its settlement included.
                Update::Connection(change @ ConnectionChange::Restarted { .. }) => {
                    self.streamed.away = true;
                    self.out.note(&format!("drover: {change}"));
                    self.out.spinner.wait("the turn");
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
    pub(super) fn lost_for_good(&mut self, why: &str) -> Exit {
        let id = &self.session_id;
        self.out.note(&format!(
            "drover: {why}; the turn's outcome is unknown: once the daemon is back, `drover \
             show {id}` says what it did and `drover resolve {id}` lets the session go on"
        ));
        Exit::Unknown
    }

    /// Reads the receipt: a settled turn ends the run. After the daemon restarted, a turn it
    /// was running is `unknown` (SPEC G2: never replayed).
    pub(super) async fn check_receipt(&mut self, restarted: bool) -> Result<Option<Exit>> {
        let receipt = self
            .client
            .receipt(&self.session_id, &self.admission_id, true)
            .await?;
        let Some(end) = receipt_end(&receipt)? else {
            return Ok(None);
        };
        if end == TurnEnd::Unknown && restarted {
            let id = &self.session_id;
            self.out.end_text();
            self.out.json_line(&receipt);
            self.out.note(&format!(
                "drover: the daemon stopped while the turn ran; its outcome is unknown; \
                 `drover resolve {id}` closes it as interrupted and lets the session go on"
            ));
            return Ok(Some(Exit::Unknown));
        }
        let error = receipt.result.as_ref().and_then(|res| res.error.clone());
        self.out.end_text();
        self.out.json_line(&receipt);
        Ok(Some(self.finish(end, error.as_deref())))
    }

    /// With `--json`, the turn's last line: its receipt with the result.
    pub(super) async fn json_receipt(&mut self) -> Result<()> {
        if self.out.json {
            let receipt = self
                .client
                .receipt(&self.session_id, &self.admission_id, true)
                .await?;
            self.out.json_line(&receipt);
        }
        Ok(())
    }

    pub(super) async fn ctrl_c(&mut self) -> Result<Option<Exit>> {
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
    pub(super) async fn stop_turn(&mut self) -> Result<(), ClientError> {
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
            Some(generation) => self
                .client
                .interrupt(&self.session_id, generation)
                .await
                .map(drop),
            None => Ok(()),
        }
    }

    pub(super) async fn event(&mut self, event: SessionEvent) -> Result<Option<Exit>> {
        let ours = admission_of(&event.event) == Some(self.admission_id.as_str());
        if ours || self.mine {
            self.out.json_line(&event);
        }
        match &event.event {
            EventPayload::TurnStarted(payload) if ours => {
                self.mine = true;
                self.generation = Some(payload.execution_generation);
                self.out.spinner.wait("the model");
            }
            EventPayload::TurnStarted(_) if !self.mine => {
                self.out.spinner.wait("the turn ahead of this one");
            }
            EventPayload::MessageDelta(payload) if self.mine => {
                self.out.flush_tool();
                if self.streamed.take(payload) {
                    self.out.text(&payload.text);
                }
                self.out.spinner.wait("the model");
            }
            EventPayload::TurnProgress(payload) if self.mine => match payload.phase {
                TurnPhase::ModelRequest => self.out.spinner.wait("the model"),
                TurnPhase::Tool => self.out.spinner.wait("a tool to finish"),
                TurnPhase::PromptWait => self.out.spinner.wait("an answer"),
            },
            EventPayload::ToolStart(payload) if self.mine => {
                if payload.name == crate::chat::DELEGATE_TASK && self.children.is_none() {
                    self.children = Some(ChildPrompts::start(self.client, &self.session_id));
                }
                self.out.flush_tool();
                self.out.end_text();
                self.streamed.new_message();
                self.out.hold_tool(format!(
                    "[{}] {}",
                    payload.name,
                    printable(&payload.context)
                ));
                self.out
                    .spinner
                    .wait(&format!("{} to finish", payload.name));
            }
            EventPayload::ToolComplete(payload) if self.mine => {
                self.out.flush_tool();
                if payload.is_error {
                    // `name` is null only for a call the owner does not know.
                    self.out.note(&format!(
                        "[{}] error",
                        payload.name.as_deref().unwrap_or("tool")
                    ));
                }
                self.out.spinner.wait("the model");
            }
            EventPayload::ApprovalRequest(prompt)
            | EventPayload::ClarifyRequest(prompt)
            | EventPayload::BudgetRequest(prompt)
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
            EventPayload::ApprovalSettled(payload) if self.mine => {
                let ran = payload.status == PromptSettlement::Resolved
                    && payload
                        .choice
                        .is_some_and(|choice| choice != ApprovalChoice::Deny);
                self.awaiting_approval = false;
                match self.out.take_tool() {
                    Some(line) if ran => self.out.note(&line),
                    Some(line) => self.out.note(&format!("{line} (not run)")),
                    None => {}
                }
            }
            EventPayload::MessageComplete(payload) if ours => {
                self.out.flush_tool();
                if !self.out.printed {
                    self.out.text(&payload.text);
                } else if let Some((anew, missing)) = self.streamed.missing(&payload.text) {
                    if anew {
                        self.out.end_text();
                    }
                    self.out.text(missing);
                }
                self.out.end_text();
            }
            EventPayload::TurnSettled(payload) if ours => {
                self.out.flush_tool();
                self.out.end_text();
                self.json_receipt().await?;
                if payload.outcome == TurnEnd::Unknown {
                    let id = &self.session_id;
                    self.out.note(&format!(
                        "drover: the turn's outcome is unknown (its worker or the daemon died \
                         while it ran); it will not be replayed; `drover resolve {id}` closes \
                         it and lets the session go on"
                    ));
                    return Ok(Some(Exit::Unknown));
                }
                return Ok(Some(self.finish(payload.outcome, payload.error.as_deref())));
            }
            EventPayload::AdmissionUpdated(payload)
                if ours && payload.outcome == Some(AdmissionOutcome::Cancelled) =>
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

    pub(super) fn finish(&mut self, end: TurnEnd, error: Option<&str>) -> Exit {
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
                let other = other.as_str();
                match error {
                    Some(e) => self.out.note(&format!("drover: turn {other}: {e}")),
                    None => self.out.note(&format!("drover: turn {other}")),
                }
                Exit::Failed
            }
        }
    }
}

/// The admission an event is about, for the events that name one.
pub(super) fn admission_of(event: &EventPayload) -> Option<&str> {
    match event {
        EventPayload::TurnStarted(payload) => Some(&payload.admission_id),
        EventPayload::MessageComplete(payload) => Some(&payload.admission_id),
        EventPayload::TurnSettled(payload) => Some(&payload.admission_id),
        EventPayload::AdmissionUpdated(payload) => Some(&payload.admission_id),
        EventPayload::TurnProgress(payload) => Some(&payload.admission_id),
        _ => None,
    }
}

/// How a settled receipt's turn ended: `unknown` while its status is, else its outcome.
pub(super) fn receipt_end(r: &AdmissionReceipt) -> Result<Option<TurnEnd>> {
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

#[cfg(test)]
mod tests {
    use super::Streamed;
    use drover_protocol::event::MessageDelta;

    fn delta(index: u64, text: &str) -> MessageDelta {
        MessageDelta {
            text: text.into(),
            delta_index: index,
        }
    }

    #[test]
    fn missed_deltas_are_made_up_from_the_complete_text() {
        // Nothing missed: the complete text adds nothing.
        let mut s = Streamed::default();
        assert!(s.take(&delta(0, "all ")) && s.take(&delta(1, "here")));
        assert_eq!(s.missing("all here"), None);

        // The end missed while away: only the rest is printed.
        let mut s = Streamed::default();
        assert!(s.take(&delta(0, "answered ")));
        s.away = true;
        assert_eq!(s.missing("answered after"), Some((false, "after")));

        // A hole: later deltas are held back, and the complete text gives the rest.
        let mut s = Streamed::default();
        assert!(s.take(&delta(0, "one ")));
        assert!(!s.take(&delta(2, "three")));
        assert!(!s.take(&delta(3, " four")));
        assert_eq!(
            s.missing("one two three four"),
            Some((false, "two three four"))
        );

        // The message's start missed: nothing of it printed, then all of it.
        let mut s = Streamed::default();
        assert!(!s.take(&delta(1, " restart")));
        assert_eq!(
            s.missing("after the restart"),
            Some((false, "after the restart"))
        );

        // A new message after a tool call starts afresh.
        let mut s = Streamed::default();
        assert!(s.take(&delta(0, "first")));
        s.new_message();
        s.away = true;
        assert!(s.take(&delta(0, "sec")));
        assert_eq!(s.missing("second"), Some((false, "ond")));
        assert_eq!(s.missing("other"), Some((true, "other")));
    }
}
