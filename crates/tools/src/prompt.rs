//! How tools reach a human: the [`PromptBroker`] a tool asks through (the worker implements it
//! by persisting `prompt.open`), the [`PromptAnswer`] it gets, and two brokers with no human
//! behind them ([`NoPrompts`], [`ScriptedPrompts`]).

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

/// The answer of a prompt opened by a tool.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptAnswer {
    /// The human's choice (`once|session|always|deny`) or clarify answer.
    Answered(Value),
    /// The prompt was closed without an answer (interrupt, owner gone).
    Cancelled,
}

/// How tools reach a human. The worker implements this by persisting `prompt.open`.
#[async_trait]
pub trait PromptBroker: Send + Sync {
    /// Opens a prompt of `kind` (`approval` | `clarify`) with `body` and waits for the answer.
    async fn open(&self, kind: &str, body: Value) -> PromptAnswer;
}

/// A broker that cancels every prompt (for contexts with no human).
pub struct NoPrompts;

#[async_trait]
impl PromptBroker for NoPrompts {
    async fn open(&self, _kind: &str, _body: Value) -> PromptAnswer {
        PromptAnswer::Cancelled
    }
}

/// A broker that plays the human from a script (for tests, and for running tools with canned
/// answers): the scripted answers in order, then the standing one for every later prompt, or
/// no answer at all (the prompt stays open until the call is cancelled). It records every
/// prompt it was shown.
#[derive(Default)]
pub struct ScriptedPrompts {
    answers: std::sync::Mutex<std::collections::VecDeque<PromptAnswer>>,
    standing: Option<PromptAnswer>,
    seen: std::sync::Mutex<Vec<(String, Value)>>,
}

impl ScriptedPrompts {
    /// Answers every prompt with `answer`.
    pub fn always(answer: PromptAnswer) -> Arc<ScriptedPrompts> {
        Arc::new(ScriptedPrompts {
            standing: Some(answer),
            ..ScriptedPrompts::default()
        })
    }

    /// Answers the first prompts with `answers`, in order, and never answers the rest.
    pub fn in_order(answers: Vec<PromptAnswer>) -> Arc<ScriptedPrompts> {
        Arc::new(ScriptedPrompts {
            answers: std::sync::Mutex::new(answers.into()),
            ..ScriptedPrompts::default()
        })
    }

    /// `(kind, body)` of every prompt opened so far.
    pub fn seen(&self) -> Vec<(String, Value)> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[async_trait]
impl PromptBroker for ScriptedPrompts {
    async fn open(&self, kind: &str, body: Value) -> PromptAnswer {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((kind.to_string(), body));
        let next = self
            .answers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front();
        match next.or_else(|| self.standing.clone()) {
            Some(answer) => answer,
            None => std::future::pending().await,
        }
    }
}
