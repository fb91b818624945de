//! Assembly of a streamed completion from `chat.completion.chunk` events.
//!
//! [`StreamAssembly`] is plain state: it takes one event's `data` at a time and knows nothing
//! of HTTP, so it is tested without a server. The SSE framing itself is parsed by
//! `eventsource-stream` in the client.

use std::collections::BTreeMap;

use drover_protocol::Usage;

use crate::chat_completions::{self, Chunk};
use crate::{Completion, ModelError};

/// What one event meant.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Keep reading.
    More,
    /// `[DONE]` was seen: the completion is whole.
    Done,
}

/// A completion being assembled from one API's stream events, one event's `data` at a time.
pub(crate) trait EventAssembly: Send {
    /// Takes one event's `data`; text pieces go to `on_delta` as they arrive.
    fn push(
        &mut self,
        data: &str,
        on_delta: &mut (dyn FnMut(&str) + Send),
    ) -> Result<Step, ModelError>;

    /// True once the answer is whole, so a stream that then ends without its end marker is
    /// still complete.
    fn finished(&self) -> bool;

    /// The error of a stream that ended before it was whole.
    fn unfinished(&self) -> ModelError;

    /// The assembled completion.
    fn finish(self) -> Result<Completion, ModelError>;
}

/// A completion being assembled from stream events.
#[derive(Debug, Default)]
pub(crate) struct StreamAssembly {
    text: String,
    /// Tool calls by their `index`, which is the only thing tying argument pieces together.
    calls: BTreeMap<u64, PartialCall>,
    usage: Option<Usage>,
    usage_extra: crate::UsageExtra,
    finish_reason: Option<String>,
    model: Option<String>,
}

#[derive(Debug, Default)]
struct PartialCall {
    id: Option<String>,
    name: Option<String>,
    arguments: String,
}

impl EventAssembly for StreamAssembly {
    fn push(
        &mut self,
        data: &str,
        on_delta: &mut (dyn FnMut(&str) + Send),
    ) -> Result<Step, ModelError> {
        let data = data.trim();
        if data.is_empty() {
            return Ok(Step::More);
        }
        if data == "[DONE]" {
            return Ok(Step::Done);
        }
        let chunk: Chunk = serde_json::from_str(data).map_err(|e| {
            ModelError::Protocol(format!(
                "a stream event is not a chat.completion.chunk ({e}): {}",
                chat_completions::truncate(data, 200)
            ))
        })?;
        if let Some(error) = chunk.error {
            return Err(ModelError::Protocol(format!(
                "the stream carried an error: {}",
                error.message()
            )));
        }
        if self.model.is_none() {
            self.model = chunk.model.filter(|m| !m.is_empty());
        }
        if let Some(usage) = chunk.usage {
            self.usage = Some(usage.to_usage());
            self.usage_extra = usage.extra();
        }
        for choice in chunk.choices.unwrap_or_default() {
            if let Some(reason) = choice.finish_reason {
                self.finish_reason = Some(reason);
            }
            let Some(delta) = choice.delta else { continue };
            if let Some(piece) = delta.content.filter(|p| !p.is_empty()) {
                on_delta(&piece);
                self.text.push_str(&piece);
            }
            for (position, call) in delta.tool_calls.unwrap_or_default().into_iter().enumerate() {
                // A server that omits `index` sends whole calls, one per array slot.
                let slot = self
                    .calls
                    .entry(call.index.unwrap_or(position as u64))
                    .or_default();
                if slot.id.is_none() {
                    slot.id = call.id.filter(|id| !id.is_empty());
                }
                if let Some(function) = call.function {
                    if slot.name.is_none() {
                        slot.name = function.name.filter(|n| !n.is_empty());
                    }
                    if let Some(arguments) = function.arguments {
                        slot.arguments.push_str(&arguments);
                    }
                }
            }
        }
        Ok(Step::More)
    }

    /// True once a `finish_reason` was seen.
    fn finished(&self) -> bool {
        self.finish_reason.is_some()
    }

    fn unfinished(&self) -> ModelError {
        ModelError::Protocol(
            "the event stream ended before `data: [DONE]` and without a finish_reason".to_string(),
        )
    }

    /// Tool calls in `index` order.
    fn finish(self) -> Result<Completion, ModelError> {
        let mut tool_calls = Vec::with_capacity(self.calls.len());
        for (index, call) in self.calls {
            tool_calls.push(chat_completions::tool_call(
                index,
                call.id,
                call.name,
                call.arguments,
            )?);
        }
        Ok(Completion {
            message: chat_completions::assistant_message(self.text, tool_calls),
            usage: self.usage,
            usage_extra: self.usage_extra,
            finish_reason: self.finish_reason,
            model: self.model,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(events: &[&str]) -> (Result<Completion, ModelError>, Vec<String>, bool) {
        let mut seen = Vec::new();
        let mut assembly = StreamAssembly::default();
        let mut done = false;
        for data in events {
            match assembly.push(data, &mut |d: &str| seen.push(d.to_string())) {
                Ok(Step::Done) => {
                    done = true;
                    break;
                }
                Ok(Step::More) => {}
                Err(e) => return (Err(e), seen, done),
            }
        }
        (assembly.finish(), seen, done)
    }

    #[test]
    fn interleaved_calls_are_assembled_by_index() {
        let (done, _, saw_done) = run(&[
            r#"{"choices":[{"delta":{"tool_calls":[{"index":1,"id":"b","function":{"name":"g","arguments":""}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"f","arguments":"{\"x\""}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":1,"function":{"arguments":"{}"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}}]}}]}"#,
            r#"{"choices":[{"delta":{},"finish_reason":"tool_calls"}],"usage":null}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}"#,
            "[DONE]",
        ]);
        let done = done.unwrap();
        assert!(saw_done);
        let calls = &done.message.tool_calls;
        assert_eq!(calls.len(), 2);
        assert_eq!(
            (calls[0].id.as_str(), calls[0].function.name.as_str()),
            ("a", "f")
        );
        assert_eq!(calls[0].function.arguments, r#"{"x":1}"#);
        assert_eq!(calls[1].function.arguments, "{}");
        assert_eq!(done.message.content, None);
        assert_eq!(done.usage.map(|u| u.total_tokens), Some(3));
    }

    #[test]
    fn error_event_fails_with_its_message() {
        let (done, seen, _) = run(&[
            r#"{"choices":[{"delta":{"content":"par"}}]}"#,
            r#"{"error":{"message":"upstream overloaded"}}"#,
        ]);
        let err = done.unwrap_err().to_string();
        assert!(err.contains("upstream overloaded"), "{err}");
        assert_eq!(seen, ["par"]);
    }

    #[test]
    fn bad_json_is_a_protocol_error() {
        let (done, _, _) = run(&["{not json"]);
        assert!(matches!(done, Err(ModelError::Protocol(_))));
    }

    #[test]
    fn call_without_name_is_a_protocol_error() {
        let (done, _, _) = run(&[
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]}"#,
        ]);
        assert!(matches!(done, Err(ModelError::Protocol(_))));
    }
}
