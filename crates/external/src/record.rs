//! What the agent says, into drover's transcript through the [`TurnStore`]: its text
//! coalesced (one assistant message per stretch, ended by a tool call or the turn's end), each
//! tool call as an assistant message carrying it once its input is known, and its result as a
//! tool message once it is `completed` or `failed`. Thoughts, plans, mode and command lists
//! are not stored (drover's transcript holds what was said and done).

use std::collections::BTreeMap;

use agent_client_protocol::v1::schema::{
    ContentBlock, SessionUpdate, ToolCall as AcpToolCall, ToolCallContent, ToolCallStatus,
    ToolCallUpdate, ToolKind,
};
use drover_agent::{StoreError, TurnStore, MAX_MESSAGE_BYTES};
use drover_protocol::{ChatMessage, FunctionCall, Role, ToolCall};
use serde_json::Value;

use crate::permission::kind_word;

/// A stretch of text this long is stored and a new one begun, so each message fits a frame.
const TEXT_FLUSH_BYTES: usize = MAX_MESSAGE_BYTES / 4;
/// At most this many bytes of a tool call's result are stored; the rest is cut with a note.
pub const RESULT_MAX_BYTES: usize = 50_000;
/// The result of a call the agent never reported as finished in a turn that ended.
pub const NO_RESULT: &str = "the agent reported no result for this call";

/// The keys under which agents put a command's output in a call's `rawOutput` (codex-acp's
/// `formatted_output`, OpenCode's `output`...), the first one present wins.
const OUTPUT_KEYS: &[&str] = &["formatted_output", "aggregated_output", "output", "stdout"];

/// A call's `rawOutput` as its result text: a string as it is, an object's output field
/// ([`OUTPUT_KEYS`]), else the JSON.
fn output_text(raw: &Value) -> String {
    match raw {
        Value::String(s) => s.clone(),
        Value::Object(fields) => OUTPUT_KEYS
            .iter()
            .find_map(|key| fields.get(*key).and_then(Value::as_str))
            .map_or_else(|| raw.to_string(), str::to_string),
        other => other.to_string(),
    }
}

/// One tool call as the agent has described it so far.
#[derive(Debug, Default)]
struct Call {
    title: String,
    name: Option<String>,
    kind: Option<ToolKind>,
    status: ToolCallStatus,
    raw_input: Option<Value>,
    raw_output: Option<Value>,
    content: Vec<ToolCallContent>,
    announced: bool,
    finished: bool,
}

impl Call {
    /// The tool name stored: the agent's `name`, else its `kind`, else its title.
    fn tool_name(&self) -> String {
        if let Some(name) = self.name.as_ref().filter(|n| !n.is_empty()) {
            return name.clone();
        }
        match &self.kind {
            Some(kind) if *kind != ToolKind::Other => kind_word(kind),
            _ if !self.title.is_empty() => self.title.clone(),
            _ => "tool".to_string(),
        }
    }

    /// The stored result: the text content, a line per diff, a terminal's id, else the raw
    /// output, else the status; cut to [`RESULT_MAX_BYTES`].
    fn result(&self) -> String {
        let mut parts: Vec<String> = Vec::new();
        for content in &self.content {
            match content {
                ToolCallContent::Content(c) => match &c.content {
                    ContentBlock::Text(t) => parts.push(t.text.clone()),
                    ContentBlock::ResourceLink(link) => parts.push(link.uri.clone()),
                    _ => parts.push("[non-text content]".to_string()),
                },
                ToolCallContent::Diff(diff) => {
                    let old = diff.old_text.as_deref().map_or(0, |t| t.lines().count());
                    let new = diff.new_text.lines().count();
                    let verb = if diff.old_text.is_none() {
                        "created"
                    } else {
                        "edited"
                    };
                    parts.push(format!(
                        "{verb} {} ({old} -> {new} lines)",
                        diff.path.display()
                    ));
                }
                ToolCallContent::Terminal(t) => {
                    parts.push(format!("[terminal {}]", t.terminal_id.0))
                }
                _ => {}
            }
        }
        let mut text = if !parts.is_empty() {
            parts.join("\n")
        } else if let Some(raw) = &self.raw_output {
            output_text(raw)
        } else {
            match self.status {
                ToolCallStatus::Failed => "failed".to_string(),
                _ => "completed".to_string(),
            }
        };
        if text.len() > RESULT_MAX_BYTES {
            let mut cut = RESULT_MAX_BYTES;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            let dropped = text.len() - cut;
            text.truncate(cut);
            text.push_str(&format!("\n[{dropped} more bytes not stored]"));
        }
        text
    }

    fn merge_call(&mut self, call: AcpToolCall) {
        self.title = call.title;
        if call.name.is_some() {
            self.name = call.name;
        }
        self.kind = Some(call.kind);
        self.status = call.status;
        if call.raw_input.is_some() {
            self.raw_input = call.raw_input;
        }
        if call.raw_output.is_some() {
            self.raw_output = call.raw_output;
        }
        if !call.content.is_empty() {
            self.content = call.content;
        }
    }

    fn merge_update(&mut self, update: ToolCallUpdate) {
        let fields = update.fields;
        if let Some(title) = fields.title {
            self.title = title;
        }
        if fields.name.is_some() {
            self.name = fields.name;
        }
        if fields.kind.is_some() {
            self.kind = fields.kind;
        }
        if let Some(status) = fields.status {
            self.status = status;
        }
        if fields.raw_input.is_some() {
            self.raw_input = fields.raw_input;
        }
        if fields.raw_output.is_some() {
            self.raw_output = fields.raw_output;
        }
        if let Some(content) = fields.content {
            self.content = content;
        }
    }
}

/// The turn's transcript as the agent speaks.
pub struct Recorder<'a> {
    store: &'a dyn TurnStore,
    text: String,
    last_text: String,
    calls: BTreeMap<String, Call>,
    /// Call ids in the order they were first seen.
    order: Vec<String>,
    /// The tokens in the agent's context at its last `usage_update` of the turn.
    context_used: Option<u64>,
}

impl<'a> Recorder<'a> {
    /// A recorder writing to `store`.
    pub fn new(store: &'a dyn TurnStore) -> Recorder<'a> {
        Recorder {
            store,
            text: String::new(),
            last_text: String::new(),
            calls: BTreeMap::new(),
            order: Vec::new(),
            context_used: None,
        }
    }

    /// The tokens in the agent's context at its last `usage_update` of this turn, if any.
    pub fn context_used(&self) -> Option<u64> {
        self.context_used
    }

    /// The last stretch of agent text (the turn's final response once it ended).
    pub fn final_response(&self) -> &str {
        if self.text.is_empty() {
            &self.last_text
        } else {
            &self.text
        }
    }

    /// Records one `session/update`.
    pub async fn update(&mut self, update: SessionUpdate) -> Result<(), StoreError> {
        match update {
            SessionUpdate::AgentMessageChunk(chunk) => {
                if let ContentBlock::Text(t) = chunk.content {
                    self.store.delta(&t.text);
                    self.text.push_str(&t.text);
                    if self.text.len() >= TEXT_FLUSH_BYTES {
                        self.flush().await?;
                    }
                }
                Ok(())
            }
            SessionUpdate::ToolCall(call) => {
                let id = call.tool_call_id.0.to_string();
                self.entry(&id).merge_call(call);
                self.progress(&id).await
            }
            SessionUpdate::ToolCallUpdate(update) => {
                let id = update.tool_call_id.0.to_string();
                self.entry(&id).merge_update(update);
                self.progress(&id).await
            }
            SessionUpdate::UsageUpdate(usage) => {
                tracing::debug!(used = usage.used, size = usage.size, "agent context usage");
                self.context_used = Some(usage.used);
                Ok(())
            }
            other => {
                tracing::trace!(update = ?other, "agent update not stored");
                Ok(())
            }
        }
    }

    /// A permission request's tool call: announced now (its input is what is asked about, and
    /// a call asked about is in the transcript even if the agent dies before the answer). What
    /// the request says fills in only what the call's own updates have not: its content is the
    /// question, not the call's result.
    pub async fn asked(&mut self, tool_call: ToolCallUpdate) -> Result<(), StoreError> {
        let id = tool_call.tool_call_id.0.to_string();
        let fields = tool_call.fields;
        let call = self.entry(&id);
        if call.title.is_empty() {
            call.title = fields.title.unwrap_or_default();
        }
        if call.kind.is_none() {
            call.kind = fields.kind;
        }
        if call.name.is_none() {
            call.name = fields.name;
        }
        if call.raw_input.is_none() {
            call.raw_input = fields.raw_input;
        }
        self.announce(&id).await
    }

    fn entry(&mut self, id: &str) -> &mut Call {
        if !self.calls.contains_key(id) {
            self.order.push(id.to_string());
        }
        self.calls.entry(id.to_string()).or_default()
    }

    /// Announces a call once its input is known or it started running; stores its result
    /// once it finished.
    async fn progress(&mut self, id: &str) -> Result<(), StoreError> {
        let Some(call) = self.calls.get(id) else {
            return Ok(());
        };
        // Not at the first sight of a pending call: agents send its input in steps.
        if !call.announced && call.status != ToolCallStatus::Pending {
            self.announce(id).await?;
        }
        let finished = self.calls.get(id).is_some_and(|c| {
            matches!(c.status, ToolCallStatus::Completed | ToolCallStatus::Failed)
        });
        if finished {
            self.finish(id, None).await?;
        }
        Ok(())
    }

    /// Stores the pending text as one assistant message.
    pub async fn flush(&mut self) -> Result<(), StoreError> {
        if self.text.is_empty() {
            return Ok(());
        }
        let text = std::mem::take(&mut self.text);
        self.store
            .append(
                vec![ChatMessage::text(Role::Assistant, text.clone())],
                BTreeMap::new(),
                Vec::new(),
            )
            .await?;
        self.last_text = text;
        Ok(())
    }

    /// Stores the assistant message carrying call `id`, once.
    async fn announce(&mut self, id: &str) -> Result<(), StoreError> {
        if self.calls.get(id).is_none_or(|c| c.announced) {
            return Ok(());
        }
        self.flush().await?;
        let Some(call) = self.calls.get_mut(id) else {
            return Ok(());
        };
        call.announced = true;
        let arguments = call
            .raw_input
            .as_ref()
            .map_or_else(|| "{}".to_string(), Value::to_string);
        let message = ChatMessage {
            role: Role::Assistant,
            content: None,
            tool_calls: vec![ToolCall {
                id: id.to_string(),
                kind: "function".to_string(),
                function: FunctionCall {
                    name: call.tool_name(),
                    arguments,
                },
            }],
            tool_call_id: None,
            tool_name: None,
        };
        let mut contexts = BTreeMap::new();
        if !call.title.is_empty() {
            contexts.insert(id.to_string(), call.title.clone());
        }
        self.store
            .append(vec![message], contexts, Vec::new())
            .await?;
        Ok(())
    }

    /// Stores call `id`'s result, once: its own, or `forced` (an error) for a call the turn
    /// ended without.
    async fn finish(&mut self, id: &str, forced: Option<&str>) -> Result<(), StoreError> {
        if self.calls.get(id).is_none_or(|c| c.finished) {
            return Ok(());
        }
        self.announce(id).await?;
        let Some(call) = self.calls.get_mut(id) else {
            return Ok(());
        };
        call.finished = true;
        let (content, failed) = match forced {
            Some(text) => (text.to_string(), true),
            None => (call.result(), call.status == ToolCallStatus::Failed),
        };
        let errors = if failed {
            vec![id.to_string()]
        } else {
            Vec::new()
        };
        let message = ChatMessage::tool_result(id, call.tool_name(), content);
        self.store
            .append(vec![message], BTreeMap::new(), errors)
            .await?;
        Ok(())
    }

    /// Ends the turn's transcript: every call without a result gets `open_result` (an error),
    /// then the last stretch of text is stored as the turn's last message.
    pub async fn end(&mut self, open_result: &str) -> Result<(), StoreError> {
        for id in self.order.clone() {
            self.finish(&id, Some(open_result)).await?;
        }
        if !self.text.is_empty() {
            let text = std::mem::take(&mut self.text);
            self.store
                .append_last(
                    ChatMessage::text(Role::Assistant, text.clone()),
                    BTreeMap::new(),
                )
                .await?;
            self.last_text = text;
        }
        Ok(())
    }
}
