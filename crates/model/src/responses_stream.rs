//! Assembly of a streamed Responses API answer from its SSE events.
//!
//! [`ResponsesAssembly`] is plain state, like the chat completions `StreamAssembly`: it takes
//! one event's `data` at a time. Items are tracked by `output_index`: a `message` item
//! gathers `response.output_text.delta` text (shown as it comes), a `function_call` item its
//! `response.function_call_arguments.delta` pieces, a `reasoning` item is kept whole from
//! `response.output_item.done`. `response.completed` (or `response.incomplete`) ends the
//! stream with the usage; when it carries the whole `output`, that output is the answer (the
//! server's own account), else the assembled items are. `response.failed` and `error` events
//! fail the request with the server's message. Other events (`response.created`,
//! `content_part`, `*.done` of text and arguments, ...) add nothing and are skipped.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use crate::chat_completions;
use crate::responses::{self, Answer, OutputItem, ReasoningItems, WireFailure, WireResponse};
use crate::stream_assembly::{EventAssembly, Step};
use crate::{Completion, ModelError};

/// The events drover reads.
#[derive(Deserialize)]
#[serde(tag = "type")]
enum Event {
    #[serde(rename = "response.output_text.delta")]
    TextDelta {
        output_index: Option<u64>,
        #[serde(default)]
        delta: String,
    },
    #[serde(rename = "response.output_item.added")]
    ItemAdded {
        output_index: Option<u64>,
        item: Value,
    },
    #[serde(rename = "response.output_item.done")]
    ItemDone {
        output_index: Option<u64>,
        item: Value,
    },
    #[serde(rename = "response.function_call_arguments.delta")]
    ArgumentsDelta {
        output_index: Option<u64>,
        #[serde(default)]
        delta: String,
    },
    #[serde(rename = "response.completed", alias = "response.incomplete")]
    Completed { response: WireResponse },
    #[serde(rename = "response.failed")]
    Failed { response: WireResponse },
    #[serde(rename = "error")]
    Error(WireFailure),
    #[serde(other)]
    Other,
}

/// One output item being assembled.
#[derive(Debug)]
enum Slot {
    Message(String),
    Call {
        call_id: Option<String>,
        name: Option<String>,
        arguments: String,
    },
    Reasoning(Value),
    Other,
}

impl Slot {
    fn of(item: &Value) -> Result<Slot, ModelError> {
        Ok(match OutputItem::read(item)? {
            message @ OutputItem::Message { .. } => Slot::Message(message.text()),
            OutputItem::FunctionCall {
                call_id,
                id,
                name,
                arguments,
            } => Slot::Call {
                call_id: call_id.or(id),
                name,
                arguments,
            },
            OutputItem::Reasoning => Slot::Reasoning(responses::reasoning_input(item)),
            OutputItem::Other => Slot::Other,
        })
    }
}

/// A Responses API answer being assembled from stream events.
#[derive(Debug)]
pub(crate) struct ResponsesAssembly {
    items: BTreeMap<u64, Slot>,
    /// The last item an event named, for events that do not say (`output_index` is optional
    /// in what drover parses, so a lax server still works).
    current: u64,
    shown: bool,
    /// Set by `response.completed`.
    answer: Option<Answer>,
    reasoning: ReasoningItems,
}

impl ResponsesAssembly {
    /// An empty assembly whose reasoning items go to `reasoning` when it finishes.
    pub fn new(reasoning: ReasoningItems) -> ResponsesAssembly {
        ResponsesAssembly {
            items: BTreeMap::new(),
            current: 0,
            shown: false,
            answer: None,
            reasoning,
        }
    }

    fn at(&mut self, output_index: Option<u64>) -> u64 {
        if let Some(index) = output_index {
            self.current = index;
        }
        self.current
    }

    /// The answer of the assembled items.
    fn assembled(&mut self, response: WireResponse) -> Result<Answer, ModelError> {
        let mut text = String::new();
        let mut calls = Vec::new();
        let mut reasoning = Vec::new();
        for slot in std::mem::take(&mut self.items).into_values() {
            match slot {
                Slot::Message(piece) => text.push_str(&piece),
                Slot::Call {
                    call_id,
                    name,
                    arguments,
                } => {
                    let index = calls.len() as u64;
                    calls.push(chat_completions::tool_call(
                        index, call_id, name, arguments,
                    )?);
                }
                Slot::Reasoning(item) => reasoning.push(item),
                Slot::Other => {}
            }
        }
        Ok(Answer {
            completion: responses::completion(
                text,
                calls,
                response.usage.as_ref(),
                responses::finish_reason(
                    response.status.as_deref(),
                    response.incomplete_details.as_ref(),
                ),
                response.model,
            ),
            reasoning,
        })
    }
}

impl EventAssembly for ResponsesAssembly {
    fn push(
        &mut self,
        data: &str,
        on_delta: &mut (dyn FnMut(&str) + Send),
    ) -> Result<Step, ModelError> {
        let data = data.trim();
        if data.is_empty() || data == "[DONE]" {
            return Ok(if self.answer.is_some() {
                Step::Done
            } else {
                Step::More
            });
        }
        let event: Event = serde_json::from_str(data).map_err(|e| {
            ModelError::Protocol(format!(
                "a stream event is not a Responses API event ({e}): {}",
                chat_completions::truncate(data, 200)
            ))
        })?;
        match event {
            Event::TextDelta {
                output_index,
                delta,
            } => {
                let index = self.at(output_index);
                if delta.is_empty() {
                    return Ok(Step::More);
                }
                on_delta(&delta);
                self.shown = true;
                match self
                    .items
                    .entry(index)
                    .or_insert_with(|| Slot::Message(String::new()))
                {
                    Slot::Message(text) => text.push_str(&delta),
                    other => *other = Slot::Message(delta),
                }
            }
            Event::ItemAdded { output_index, item } => {
                let index = self.at(output_index);
                self.items.insert(index, Slot::of(&item)?);
            }
            Event::ArgumentsDelta {
                output_index,
                delta,
            } => {
                let index = self.at(output_index);
                if let Some(Slot::Call { arguments, .. }) = self.items.get_mut(&index) {
                    arguments.push_str(&delta);
                }
            }
            Event::ItemDone { output_index, item } => {
                let index = self.at(output_index);
                let done = Slot::of(&item)?;
                // A server that sends a message only whole still shows its text.
                if let Slot::Message(text) = &done {
                    if !self.shown && !text.is_empty() {
                        on_delta(text);
                        self.shown = true;
                    }
                }
                self.items.insert(index, done);
            }
            Event::Completed { mut response } => {
                if let Some(error) = response.failure() {
                    return Err(error);
                }
                let answer = if response.output.as_ref().is_some_and(|o| !o.is_empty()) {
                    response.into_answer()?
                } else {
                    self.assembled(response)?
                };
                // An answer that came only whole in `response.completed` is still shown.
                if let Some(text) = answer.completion.message.content.as_deref() {
                    if !self.shown && !text.is_empty() {
                        on_delta(text);
                        self.shown = true;
                    }
                }
                self.answer = Some(answer);
                return Ok(Step::Done);
            }
            Event::Failed { mut response } => {
                return Err(response
                    .failure()
                    .unwrap_or_else(|| WireFailure::default().into_error()));
            }
            Event::Error(failure) => return Err(failure.into_error()),
            Event::Other => {}
        }
        Ok(Step::More)
    }

    fn finished(&self) -> bool {
        self.answer.is_some()
    }

    fn unfinished(&self) -> ModelError {
        ModelError::Protocol("the event stream ended before `response.completed`".to_string())
    }

    fn finish(self) -> Result<Completion, ModelError> {
        match self.answer {
            Some(answer) => Ok(answer.keep(&self.reasoning)),
            None => Err(self.unfinished()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(events: &[Value]) -> (Result<Completion, ModelError>, Vec<String>) {
        let mut seen = Vec::new();
        let mut assembly = ResponsesAssembly::new(ReasoningItems::default());
        for event in events {
            match assembly.push(&event.to_string(), &mut |d: &str| seen.push(d.to_string())) {
                Ok(Step::Done) => break,
                Ok(Step::More) => {}
                Err(e) => return (Err(e), seen),
            }
        }
        (assembly.finish(), seen)
    }

    #[test]
    fn deltas_and_arguments_are_assembled_by_output_index() {
        let (done, seen) = run(&[
            json!({"type": "response.created", "response": {}}),
            json!({"type": "response.output_item.added", "output_index": 0,
                   "item": {"type": "message", "content": []}}),
            json!({"type": "response.output_text.delta", "output_index": 0, "delta": "he"}),
            json!({"type": "response.output_text.delta", "output_index": 0, "delta": "y"}),
            json!({"type": "response.output_item.added", "output_index": 1,
                   "item": {"type": "function_call", "call_id": "c1", "name": "f",
                            "arguments": ""}}),
            json!({"type": "response.function_call_arguments.delta", "output_index": 1,
                   "delta": "{\"a\""}),
            json!({"type": "response.function_call_arguments.delta", "output_index": 1,
                   "delta": ":1}"}),
            json!({"type": "response.completed", "response": {"status": "completed",
                   "usage": {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7}}}),
        ]);
        let done = done.unwrap();
        assert_eq!(seen, ["he", "y"]);
        assert_eq!(done.message.content.as_deref(), Some("hey"));
        assert_eq!(done.message.tool_calls[0].id, "c1");
        assert_eq!(done.message.tool_calls[0].function.arguments, r#"{"a":1}"#);
        assert_eq!(done.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(done.usage.map(|u| u.total_tokens), Some(7));
    }

    #[test]
    fn an_error_event_fails_with_its_message() {
        let (done, seen) = run(&[
            json!({"type": "response.output_text.delta", "output_index": 0, "delta": "par"}),
            json!({"type": "error", "code": "server_error", "message": "upstream overloaded"}),
        ]);
        let err = done.unwrap_err();
        assert!(matches!(err, ModelError::Protocol(_)), "{err}");
        assert!(err.to_string().contains("upstream overloaded"), "{err}");
        assert_eq!(seen, ["par"]);
    }

    #[test]
    fn a_failed_response_fails_and_an_overlong_one_is_context_exceeded() {
        let (done, _) = run(&[json!({"type": "response.failed", "response": {
            "status": "failed", "error": {"code": "rate_limit_exceeded", "message": "busy"}}})]);
        assert!(done.unwrap_err().to_string().contains("busy"));
        let (done, _) = run(&[json!({"type": "response.failed", "response": {
            "status": "failed",
            "error": {"code": "context_length_exceeded", "message": "too long"}}})]);
        assert!(matches!(done, Err(ModelError::ContextExceeded(_))));
    }

    #[test]
    fn a_stream_without_completed_is_unfinished_and_whole_items_are_shown() {
        let (done, seen) = run(&[
            json!({"type": "response.output_item.done", "output_index": 0,
            "item": {"type": "message",
                     "content": [{"type": "output_text", "text": "all at once"}]}}),
        ]);
        assert_eq!(seen, ["all at once"]);
        let err = done.unwrap_err().to_string();
        assert!(err.contains("response.completed"), "{err}");
    }
}
