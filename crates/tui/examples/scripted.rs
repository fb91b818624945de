//! The chat client against a scripted link, with no daemon: every input gets a streamed answer
//! after a tool call, and `rm` in the input asks for approval first. For trying the screen:
//! `cargo run -p drover-tui --example scripted`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use drover_protocol::client::{
    ApprovalChoice, ApprovalPrompt, ApprovalRule, OpenPrompt, PromptResponse, PromptResponseStatus,
    SessionSnapshot, SessionSummary,
};
use drover_protocol::event::{
    ApprovalSettled, EventPayload, MessageComplete, MessageDelta, PromptSettlement, SessionEvent,
    ToolComplete, ToolStart, TurnEnd, TurnSettled, TurnStarted,
};
use drover_tui::{Events, Link, LinkError, LinkUpdate, Opened, PromptAnswer, Reply, Target, Theme};
use tokio::sync::mpsc;

/// The scripted approval offers every choice, `always` included.
const EVERY_CHOICE: [ApprovalChoice; 4] = [
    ApprovalChoice::Once,
    ApprovalChoice::Session,
    ApprovalChoice::Always,
    ApprovalChoice::Deny,
];

struct Scripted {
    tx: mpsc::UnboundedSender<LinkUpdate>,
    rx: Mutex<Option<mpsc::UnboundedReceiver<LinkUpdate>>>,
    next: AtomicU64,
    answers: Mutex<Option<tokio::sync::oneshot::Sender<ApprovalChoice>>>,
}

struct Rx(mpsc::UnboundedReceiver<LinkUpdate>);

#[async_trait]
impl Events for Rx {
    async fn next(&mut self) -> Option<LinkUpdate> {
        self.0.recv().await
    }
}

fn ev(event: EventPayload) -> LinkUpdate {
    LinkUpdate::Event(SessionEvent {
        session_id: "demo".into(),
        seq: None,
        replay_epoch: "e".into(),
        event,
    })
}

#[async_trait]
impl Link for Scripted {
    async fn open(&self, _target: Target) -> Result<(Opened, Box<dyn Events>), LinkError> {
        let snapshot: SessionSnapshot = serde_json::from_value(serde_json::json!({
            "session_id": "3f2a9c1e-demo", "messages": [], "pending": [], "prompts": [],
            "running": false, "processes": [], "jobs": [], "execution_generation": 0,
            "replay_epoch": "e", "last_sequence": 0,
            "info": {"model": "demo-model", "cwd": "/", "source": "cli", "toolsets": [], "title": null}
        }))
        .unwrap();
        let rx = self
            .rx
            .lock()
            .unwrap()
            .take()
            .ok_or(LinkError("opened twice".into()))?;
        Ok((
            Opened {
                snapshot,
                running_events: vec![],
                history: vec![],
            },
            Box::new(Rx(rx)),
        ))
    }

    async fn submit(&self, _s: &str, text: &str) -> Result<String, LinkError> {
        let n = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let admission = format!("a{n}");
        let tx = self.tx.clone();
        let (answer_tx, answer_rx) = tokio::sync::oneshot::channel();
        let dangerous = text.contains("rm");
        if dangerous {
            *self.answers.lock().unwrap() = Some(answer_tx);
        }
        let id = admission.clone();
        tokio::spawn(async move {
            let pause = |ms| tokio::time::sleep(Duration::from_millis(ms));
            pause(100).await;
            tx.send(ev(EventPayload::TurnStarted(TurnStarted {
                admission_id: id.clone(),
                execution_generation: n,
            })))
            .ok();
            let command = if dangerous {
                "rm -rf target/tmp"
            } else {
                "ls crates"
            };
            tx.send(ev(EventPayload::ToolStart(ToolStart {
                tool_id: "c1".into(),
                name: "terminal".into(),
                context: command.into(),
                args: serde_json::Value::Null,
            })))
            .ok();
            let mut result = "agent\ncli\nledger\nowner\nprotocol\ntui".to_string();
            if dangerous {
                tx.send(ev(EventPayload::ApprovalRequest(OpenPrompt::Approval(
                    ApprovalPrompt {
                        prompt_id: "p1".into(),
                        execution_generation: n,
                        command: command.into(),
                        description: format!("deletes files recursively: {command}"),
                        pattern_key: "recursive_delete".into(),
                        choices: EVERY_CHOICE.to_vec(),
                        class: String::new(),
                        scopes: Vec::new(),
                    },
                ))))
                .ok();
                let choice = answer_rx.await.unwrap_or(ApprovalChoice::Deny);
                tx.send(ev(EventPayload::ApprovalSettled(ApprovalSettled {
                    prompt_id: "p1".into(),
                    status: PromptSettlement::Resolved,
                    choice: Some(choice),
                })))
                .ok();
                result = if choice == ApprovalChoice::Deny {
                    "denied by the user".into()
                } else {
                    String::new()
                };
            }
            pause(1500).await;
            tx.send(ev(EventPayload::ToolComplete(ToolComplete {
                tool_id: "c1".into(),
                name: None,
                args: serde_json::Value::Null,
                result,
                is_error: false,
            })))
            .ok();
            let answer = "The workspace has **six crates**; the chat client is `tui`:\n\n```sh\ncargo run -p drover -- chat\n```";
            for (i, piece) in answer.split_inclusive(' ').enumerate() {
                pause(40).await;
                tx.send(ev(EventPayload::MessageDelta(MessageDelta {
                    text: piece.into(),
                    delta_index: i as u64,
                })))
                .ok();
            }
            tx.send(ev(EventPayload::MessageComplete(MessageComplete {
                admission_id: id.clone(),
                text: answer.into(),
                outcome: TurnEnd::Completed,
            })))
            .ok();
            tx.send(ev(EventPayload::TurnSettled(TurnSettled {
                admission_id: id,
                outcome: TurnEnd::Completed,
                error: None,
                cost_usd: None,
            })))
            .ok();
        });
        Ok(admission)
    }

    async fn interrupt(&self, _s: &str, _g: u64) -> Result<(), LinkError> {
        Ok(())
    }
    async fn answer(&self, _s: &str, answer: PromptAnswer) -> Result<PromptResponse, LinkError> {
        let choice = match answer.reply {
            Reply::Approval(choice) => Some(choice),
            Reply::Always(_) => Some(ApprovalChoice::Always),
            _ => None,
        };
        if let Some(choice) = choice {
            if let Some(tx) = self.answers.lock().unwrap().take() {
                let _ = tx.send(choice);
            }
        }
        Ok(PromptResponse {
            status: PromptResponseStatus::Resolved,
            prompt_id: answer.prompt_id,
            reason: None,
            stored_rule: None,
        })
    }
    async fn resolve_unknown(&self, _s: &str, _a: &str) -> Result<(), LinkError> {
        Ok(())
    }
    async fn turn_tokens(&self, _s: &str, _a: &str) -> Result<u64, LinkError> {
        Ok(1234)
    }
    async fn sessions(&self) -> Result<Vec<SessionSummary>, LinkError> {
        Ok(vec![])
    }
    async fn approvals(&self) -> Result<Vec<ApprovalRule>, LinkError> {
        Ok(vec![])
    }
    async fn rename(&self, _s: &str, _t: &str) -> Result<(), LinkError> {
        Ok(())
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let (tx, rx) = mpsc::unbounded_channel();
    let link = Arc::new(Scripted {
        tx,
        rx: Mutex::new(Some(rx)),
        next: AtomicU64::new(0),
        answers: Mutex::new(None),
    });
    if let Err(e) = drover_tui::run(link, Target::New, Theme::from_env()).await {
        eprintln!("scripted: {e}");
    }
}
