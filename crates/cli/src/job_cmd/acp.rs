//! The daemon's side of `drover job submit --agent-session acp:<agent>`
//! ([`drover_jobs::acp`]): a fresh session of the agent through the client library, its first
//! turn the job's prompt, and that turn's events turned into [`TurnSignal`]s, across a daemon
//! that restarts on the way.

use std::path::PathBuf;
use std::time::Duration;

use drover_client::{Client, ClientError, ConnectionChange, SessionStream, Update};
use drover_jobs::acp::{AgentFuture, AgentSessions, TurnSignal};
use drover_jobs::Job;
use drover_protocol::client::{AdmissionReceipt, AdmissionStatus, SessionCreateParams};
use drover_protocol::event::{EventPayload, TurnEnd};
use drover_protocol::words::{AdmissionOutcome, OpenPrompt};
use tokio::sync::mpsc;

/// How long stopping the turn may take once the job ended without it.
const STOP_BOUND: Duration = Duration::from_secs(10);

/// Sessions of external agents on the home's daemon (started if none runs).
pub(super) struct DaemonSessions {
    home: PathBuf,
    /// Where the session works: the submitter's directory.
    cwd: String,
    delivered: Option<Delivered>,
}

/// The delivered turn.
struct Delivered {
    client: Client,
    session_id: String,
    admission_id: String,
}

impl DaemonSessions {
    pub(super) fn new(home: PathBuf, cwd: String) -> DaemonSessions {
        DaemonSessions {
            home,
            cwd,
            delivered: None,
        }
    }
}

impl AgentSessions for DaemonSessions {
    fn deliver<'a>(
        &'a mut self,
        agent: &'a str,
        job: &'a Job,
    ) -> AgentFuture<'a, Result<(String, mpsc::UnboundedReceiver<TurnSignal>), String>> {
        Box::pin(async move {
            let client = crate::commands::connect(&self.home)
                .await
                .map_err(|e| format!("{e:#}"))?;
            let params = SessionCreateParams {
                agent: Some(agent.to_string()),
                title: Some(format!("job {}", job.job_id)),
                source: Some("job".into()),
                ..SessionCreateParams::in_cwd(uuid::Uuid::new_v4().to_string(), self.cwd.clone())
            };
            let stream =
                client
                    .create_and_attach(params)
                    .await
                    .map_err(|e| match (e.field(), e.rpc()) {
                        // The daemon's sentence names the agents config.toml has.
                        (Some("agent"), Some(rpc)) => format!("acp:{agent}: {rpc}"),
                        _ => format!("cannot create a session of agent {agent}: {e}"),
                    })?;
            let session_id = stream.session_id().to_string();
            let receipt = client
                .submit(&session_id, &job.prompt)
                .await
                .map_err(|e| format!("session {session_id} refused the prompt: {e}"))?;
            let (tx, rx) = mpsc::unbounded_channel();
            let follower = Follower {
                client: client.clone(),
                session_id: session_id.clone(),
                admission_id: receipt.admission_id.clone(),
                mine: false,
                tx,
            };
            tokio::spawn(follower.follow(stream));
            self.delivered = Some(Delivered {
                client,
                session_id: session_id.clone(),
                admission_id: receipt.admission_id,
            });
            Ok((session_id, rx))
        })
    }

    fn stop(&mut self) -> AgentFuture<'_, ()> {
        Box::pin(async move {
            let Some(d) = &self.delivered else {
                return;
            };
            if tokio::time::timeout(STOP_BOUND, stop_turn(d))
                .await
                .is_err()
            {
                tracing::warn!(session_id = %d.session_id, "the turn was not stopped in time");
            }
        })
    }
}

/// Interrupts the turn if it started, else cancels it (a turn that started meanwhile is
/// interrupted); one already settled is left. Refusals only mean it ended on its own.
async fn stop_turn(d: &Delivered) {
    let receipt = || d.client.receipt(&d.session_id, &d.admission_id, false);
    let Ok(mut r) = receipt().await else {
        return;
    };
    if r.status == AdmissionStatus::Queued {
        let _ = d.client.cancel(&d.session_id, &d.admission_id).await;
        match receipt().await {
            Ok(now) => r = now,
            Err(_) => return,
        }
    }
    if let (AdmissionStatus::Started, Some(generation)) = (r.status, r.execution_generation) {
        match d.client.interrupt(&d.session_id, generation).await {
            Ok(_) => tracing::info!(session_id = %d.session_id, "the agent's turn interrupted"),
            Err(e) => tracing::info!(session_id = %d.session_id, error = %e, "not interrupted"),
        }
    }
}

/// Follows the delivered turn's events and sends what they mean.
struct Follower {
    client: Client,
    session_id: String,
    admission_id: String,
    /// The turn has started: the session's events are the turn's (a fresh session runs only
    /// this one).
    mine: bool,
    tx: mpsc::UnboundedSender<TurnSignal>,
}

impl Follower {
    async fn follow(mut self, mut stream: SessionStream) {
        while let Some(update) = stream.next().await {
            let signal = match update {
                Ok(Update::Event(e)) => self.event(e.event).await,
                // A daemon that came back (or a snapshot instead of the events missed) may
                // have settled the turn meanwhile: its receipt says.
                Ok(Update::Connection(
                    ConnectionChange::Reconnected { .. } | ConnectionChange::Restarted { .. },
                ))
                | Ok(Update::Snapshot(_)) => self.settled_by_receipt().await,
                Ok(Update::Connection(ConnectionChange::Lost { .. })) => None,
                Err(e @ ClientError::GaveUp { .. }) => {
                    tracing::warn!(error = %e, "lost the daemon for good; the contract decides");
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "following the agent's session failed");
                    return;
                }
            };
            let Some(signal) = signal else {
                continue;
            };
            let last = matches!(signal, TurnSignal::Completed(_) | TurnSignal::Failed(_));
            if self.tx.send(signal).is_err() || last {
                return;
            }
        }
    }

    async fn event(&mut self, event: EventPayload) -> Option<TurnSignal> {
        match event {
            EventPayload::TurnStarted(p) if p.admission_id == self.admission_id => {
                self.mine = true;
                Some(TurnSignal::Started)
            }
            EventPayload::TurnSettled(p) if p.admission_id == self.admission_id => {
                self.settled(p.outcome, p.error).await
            }
            EventPayload::AdmissionUpdated(p)
                if p.admission_id == self.admission_id
                    && p.outcome == Some(AdmissionOutcome::Cancelled) =>
            {
                Some(TurnSignal::Failed(
                    "turn cancelled before it started".into(),
                ))
            }
            EventPayload::ApprovalRequest(prompt)
            | EventPayload::ClarifyRequest(prompt)
            | EventPayload::BudgetRequest(prompt)
                if self.mine =>
            {
                Some(TurnSignal::Blocked(match prompt {
                    OpenPrompt::Approval(a) => format!("approval: {}", a.command),
                    OpenPrompt::Clarify(c) => format!("question: {}", c.question),
                    OpenPrompt::Budget(b) => format!(
                        "budget: {:.4} USD spent, limit {}",
                        b.spent_usd,
                        b.limit_usd
                            .map_or("none".to_string(), |l| format!("{l:.4} USD"))
                    ),
                }))
            }
            _ if self.mine => Some(TurnSignal::Activity),
            _ => None,
        }
    }

    /// The signal of a settled turn: its final response when it completed.
    async fn settled(&self, outcome: TurnEnd, error: Option<String>) -> Option<TurnSignal> {
        if outcome != TurnEnd::Completed {
            let why = error.unwrap_or_else(|| match outcome {
                TurnEnd::Unknown => {
                    "its worker or the daemon died while it ran; its outcome is unknown".into()
                }
                _ => "no reason given".into(),
            });
            return Some(TurnSignal::Failed(format!(
                "turn {} (session {}): {why}",
                outcome.as_str(),
                self.session_id
            )));
        }
        match self
            .client
            .receipt(&self.session_id, &self.admission_id, true)
            .await
        {
            Ok(r) => Some(TurnSignal::Completed(
                r.result.map(|res| res.final_response).unwrap_or_default(),
            )),
            Err(e) => Some(TurnSignal::Failed(format!(
                "turn completed (session {}), but its final response could not be read: {e}",
                self.session_id
            ))),
        }
    }

    /// After a reconnect: the signal of the turn if it settled meanwhile.
    async fn settled_by_receipt(&mut self) -> Option<TurnSignal> {
        let r: AdmissionReceipt = self
            .client
            .receipt(&self.session_id, &self.admission_id, false)
            .await
            .ok()?;
        let outcome = match (r.status, r.outcome) {
            (AdmissionStatus::Unknown, _) => TurnEnd::Unknown,
            (AdmissionStatus::Terminal, Some(outcome)) => TurnEnd::from(outcome),
            (AdmissionStatus::Started, _) if !self.mine => {
                self.mine = true;
                return Some(TurnSignal::Started);
            }
            _ => return None,
        };
        self.settled(outcome, r.result.and_then(|res| res.error))
            .await
    }
}
