//! What each drover thing is in ACP: pure functions from drover's wire types
//! (`drover_protocol`) to the ACP v1 schema's (docs/acp.md, "What maps to what"). No IO.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use agent_client_protocol::v1::schema::{
    ContentBlock, ContentChunk, CreateElicitationRequest, CreateElicitationResponse, Diff,
    ElicitationAction, ElicitationContentValue, ElicitationFormMode, ElicitationPropertySchema,
    ElicitationSchema, ElicitationSessionScope, McpServer, MultiSelectPropertySchema,
    PermissionOption, PermissionOptionKind, Plan, PlanEntry, PlanEntryPriority, PlanEntryStatus,
    SessionId, SessionMode, SessionModeId, SessionModeState, SessionUpdate, StopReason,
    StringPropertySchema, TextContent, ToolCall, ToolCallContent, ToolCallId, ToolCallLocation,
    ToolCallStatus, ToolCallUpdate, ToolCallUpdateFields, ToolKind,
};
use drover_protocol::chat::Role;
use drover_protocol::client::{SessionMcpServer, TranscriptMessage};
use drover_protocol::event::{ToolComplete, ToolStart, TurnEnd};
use drover_protocol::words::{
    ApprovalChoice, ApprovalPrompt, ApprovalScope, ClarifyAnswer, ClarifyPrompt,
};
use drover_protocol::ApprovalMode;
use drover_protocol::Secret;
use serde_json::Value;

/// The prefix of a clarify choice's `optionId`: `choice:<index>`.
pub const CHOICE_OPTION: &str = "choice:";

/// The option of the question "resolve the unknown turn and go on?" that says yes.
pub const RESOLVE_OPTION: &str = "resolve";
/// ... and the one that says no.
pub const KEEP_OPTION: &str = "keep";

/// A text chunk of the agent's reply.
pub fn agent_text(text: impl Into<String>) -> SessionUpdate {
    SessionUpdate::AgentMessageChunk(ContentChunk::new(ContentBlock::Text(TextContent::new(
        text,
    ))))
}

/// A text chunk of the user's message (replay only: a live prompt is the client's own).
pub fn user_text(text: impl Into<String>) -> SessionUpdate {
    SessionUpdate::UserMessageChunk(ContentChunk::new(ContentBlock::Text(TextContent::new(
        text,
    ))))
}

/// The kind ACP clients draw a drover tool as.
pub fn tool_kind(name: &str) -> ToolKind {
    match name {
        "terminal" | "process" => ToolKind::Execute,
        "read_file" => ToolKind::Read,
        "write_file" | "patch" => ToolKind::Edit,
        "search_files" | "tool_search" => ToolKind::Search,
        "todo" | "clarify" => ToolKind::Think,
        "job_submit" | "job_status" | "job_wait" | "job_cancel" | "delegate_task" => {
            ToolKind::Other
        }
        name if name.contains("fetch") || name.contains("http") => ToolKind::Fetch,
        _ => ToolKind::Other,
    }
}

/// `args.path` of a file tool as an absolute path (relative ones are under the session's
/// `cwd`), for `locations` and diffs.
fn file_path(cwd: &Path, args: &Value) -> Option<PathBuf> {
    let path = args.get("path")?.as_str()?;
    Some(cwd.join(path))
}

fn locations(name: &str, cwd: &Path, args: &Value) -> Vec<ToolCallLocation> {
    match name {
        "read_file" | "write_file" | "patch" | "search_files" => file_path(cwd, args)
            .map(|path| {
                let line = (name == "read_file")
                    .then(|| args.get("offset").and_then(Value::as_u64))
                    .flatten()
                    .and_then(|l| u32::try_from(l).ok());
                vec![ToolCallLocation::new(path).line(line)]
            })
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

/// The edit a file tool makes, as a diff: `patch`'s old and new text, `write_file`'s new
/// content (old text unknown: absent).
fn diff(name: &str, cwd: &Path, args: &Value) -> Option<ToolCallContent> {
    let path = file_path(cwd, args)?;
    let text = |key: &str| args.get(key).and_then(Value::as_str).map(str::to_string);
    match name {
        "patch" => Some(ToolCallContent::Diff(
            Diff::new(path, text("new_string")?).old_text(text("old_string")),
        )),
        "write_file" => Some(ToolCallContent::Diff(Diff::new(path, text("content")?))),
        _ => None,
    }
}

/// A tool call as it starts (`tool.start`): `in_progress`, with its title (the one-line
/// preview drover shows), kind, raw input, file locations and, for an edit, its diff.
pub fn tool_started(start: &ToolStart, cwd: &Path) -> ToolCall {
    let title = if start.context.is_empty() {
        start.name.clone()
    } else {
        format!("{}: {}", start.name, start.context)
    };
    let content: Vec<ToolCallContent> = diff(&start.name, cwd, &start.args).into_iter().collect();
    ToolCall::new(start.tool_id.clone(), title)
        .kind(tool_kind(&start.name))
        .status(ToolCallStatus::InProgress)
        .raw_input(start.args.clone())
        .locations(locations(&start.name, cwd, &start.args))
        .content(content)
}

/// What a tool's result shows: `terminal`'s `output` (and exit code), else the result text.
fn result_text(name: &str, result: &str) -> String {
    if name == "terminal" {
        if let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(result) {
            let output = fields.get("output").and_then(Value::as_str).unwrap_or("");
            let mut text = output.to_string();
            if let Some(error) = fields.get("error").and_then(Value::as_str) {
                if !error.is_empty() {
                    text.push_str(&format!("\n[error: {error}]"));
                }
            }
            if let Some(code) = fields.get("exit_code").and_then(Value::as_i64) {
                if code != 0 {
                    text.push_str(&format!("\n[exit code {code}]"));
                }
            }
            return text;
        }
    }
    result.to_string()
}

/// A tool call's end (`tool.complete`): `completed` or `failed`, with its output as text
/// content (an edit keeps its diff first).
pub fn tool_completed(done: &ToolComplete, cwd: &Path) -> ToolCallUpdate {
    let name = done.name.as_deref().unwrap_or("");
    let mut content: Vec<ToolCallContent> = diff(name, cwd, &done.args).into_iter().collect();
    content.push(ToolCallContent::from(result_text(name, &done.result)));
    let status = if done.is_error {
        ToolCallStatus::Failed
    } else {
        ToolCallStatus::Completed
    };
    let raw_output = serde_json::from_str::<Value>(&done.result)
        .unwrap_or_else(|_| Value::String(done.result.clone()));
    ToolCallUpdate::new(
        done.tool_id.clone(),
        ToolCallUpdateFields::new()
            .status(status)
            .content(content)
            .raw_output(raw_output),
    )
}

/// A tool call closed without a result: its turn was interrupted, or ended `unknown`.
pub fn tool_abandoned(tool_id: &str, why: &str) -> ToolCallUpdate {
    ToolCallUpdate::new(
        tool_id.to_string(),
        ToolCallUpdateFields::new()
            .status(ToolCallStatus::Failed)
            .content(vec![ToolCallContent::from(why.to_string())]),
    )
}

/// The `todo` tool's list (its result, `{todos: [{id, content, status}]}`) as a plan.
pub fn plan(result: &str) -> Option<Plan> {
    let value: Value = serde_json::from_str(result).ok()?;
    let todos = value.get("todos")?.as_array()?;
    let entries = todos
        .iter()
        .filter_map(|item| {
            let content = item.get("content")?.as_str()?.to_string();
            let status = match item.get("status").and_then(Value::as_str) {
                Some("in_progress") => PlanEntryStatus::InProgress,
                // A cancelled item is no longer to do: ACP has no word for it.
                Some("completed") | Some("cancelled") => PlanEntryStatus::Completed,
                _ => PlanEntryStatus::Pending,
            };
            Some(PlanEntry::new(content, PlanEntryPriority::Medium, status))
        })
        .collect();
    Some(Plan::new(entries))
}

/// How a turn's end answers `session/prompt`: `Ok(stop reason)`, or `Err(message)` for a
/// failed turn (a JSON-RPC error naming drover's error).
pub fn stop_reason(outcome: TurnEnd, error: Option<&str>) -> Result<StopReason, String> {
    match outcome {
        TurnEnd::Completed | TurnEnd::Unknown => Ok(StopReason::EndTurn),
        TurnEnd::Interrupted | TurnEnd::Cancelled => Ok(StopReason::Cancelled),
        TurnEnd::Rejected => Ok(StopReason::Refusal),
        TurnEnd::Failed => match error {
            Some(e) if e.contains("step limit") => Ok(StopReason::MaxTurnRequests),
            Some(e) => Err(e.to_string()),
            None => Err("the turn failed".to_string()),
        },
    }
}

/// The note that closes a turn whose outcome is unknown (its worker or the daemon died while
/// it ran): drover did not run it again.
pub const UNKNOWN_NOTE: &str = "\n\n[drover: the outcome of this turn is unknown: its worker or \
the daemon stopped while it ran, and drover did not run it again. The next prompt asks whether \
to resolve it and go on.]";

/// The approval modes as ACP session modes.
pub fn modes(current: ApprovalMode) -> SessionModeState {
    let mode = |m: ApprovalMode, name: &str, description: &str| {
        SessionMode::new(SessionModeId::new(m.as_str()), name).description(description.to_string())
    };
    SessionModeState::new(
        SessionModeId::new(current.as_str()),
        vec![
            mode(
                ApprovalMode::Manual,
                "Ask",
                "Ask before a dangerous command (drover's approvals mode `manual`)",
            ),
            mode(
                ApprovalMode::Auto,
                "Auto",
                "Run dangerous commands without asking (`auto`)",
            ),
            mode(
                ApprovalMode::Deny,
                "Deny",
                "Refuse dangerous commands without asking (`deny`)",
            ),
        ],
    )
}

/// The options of an approval prompt, one per choice it offers. `always` is named by the
/// scope it stores its rule for ([`always_scope`]).
pub fn approval_options(prompt: &ApprovalPrompt) -> Vec<PermissionOption> {
    prompt
        .choices
        .iter()
        .map(|choice| {
            let (name, kind) = match choice {
                ApprovalChoice::Once => ("Allow once".to_string(), PermissionOptionKind::AllowOnce),
                ApprovalChoice::Session => (
                    "Allow for this session".to_string(),
                    PermissionOptionKind::AllowAlways,
                ),
                ApprovalChoice::Always => (always_name(prompt), PermissionOptionKind::AllowAlways),
                ApprovalChoice::Deny => ("Deny".to_string(), PermissionOptionKind::RejectOnce),
            };
            PermissionOption::new(choice_word(*choice), name, kind)
        })
        .collect()
}

/// The scope ACP's one "always" option stores its rule for: the workspace when the prompt
/// offers it, else its narrowest offer; `everywhere` for a prompt stored before rules had
/// scopes.
pub fn always_scope(prompt: &ApprovalPrompt) -> (ApprovalScope, Option<&str>) {
    let scope = prompt.default_scope();
    let path = prompt.offer(scope).and_then(|o| o.path.as_deref());
    (scope, path)
}

/// The name of the "always" option: where its rule applies.
fn always_name(prompt: &ApprovalPrompt) -> String {
    match always_scope(prompt) {
        (ApprovalScope::Workspace, Some(path)) => {
            format!("Always allow in this workspace ({path})")
        }
        (ApprovalScope::Directory, Some(path)) => {
            format!("Always allow in this directory tree ({path})")
        }
        _ => "Always allow everywhere (every session of this drover home)".to_string(),
    }
}

/// The wire word of an approval choice, which is also its `optionId`.
pub fn choice_word(choice: ApprovalChoice) -> &'static str {
    match choice {
        ApprovalChoice::Once => "once",
        ApprovalChoice::Session => "session",
        ApprovalChoice::Always => "always",
        ApprovalChoice::Deny => "deny",
    }
}

/// The approval choice an `optionId` names.
pub fn approval_choice(option_id: &str) -> Option<ApprovalChoice> {
    [
        ApprovalChoice::Once,
        ApprovalChoice::Session,
        ApprovalChoice::Always,
        ApprovalChoice::Deny,
    ]
    .into_iter()
    .find(|c| choice_word(*c) == option_id)
}

/// A clarify question's choices as options (`choice:<index>`); ACP v1 has no free-text
/// answer, so a question without choices is answered from drover's own clients.
pub fn clarify_options(prompt: &ClarifyPrompt) -> Vec<PermissionOption> {
    prompt
        .choices
        .iter()
        .enumerate()
        .map(|(i, choice)| {
            PermissionOption::new(
                format!("{CHOICE_OPTION}{i}"),
                choice.clone(),
                PermissionOptionKind::AllowOnce,
            )
        })
        .collect()
}

/// The choice text a clarify `optionId` picks.
pub fn clarify_choice<'a>(prompt: &'a ClarifyPrompt, option_id: &str) -> Option<&'a str> {
    let index: usize = option_id.strip_prefix(CHOICE_OPTION)?.parse().ok()?;
    prompt.choices.get(index).map(String::as_str)
}

/// A clarify question as an elicitation form: one required field, `answer`, a choice of the
/// question's choices (several for a multi-select question), or free text when it has none.
pub fn clarify_form(
    prompt: &ClarifyPrompt,
    session_id: &str,
    tool_id: Option<String>,
) -> CreateElicitationRequest {
    let answer: ElicitationPropertySchema = if prompt.multi_select && !prompt.choices.is_empty() {
        MultiSelectPropertySchema::new(prompt.choices.clone()).into()
    } else if prompt.choices.is_empty() {
        StringPropertySchema::new().into()
    } else {
        StringPropertySchema::new()
            .enum_values(prompt.choices.clone())
            .into()
    };
    let schema = ElicitationSchema::new().property(CLARIFY_FIELD, answer, true);
    let scope = ElicitationSessionScope::new(SessionId::new(session_id.to_string()))
        .tool_call_id(tool_id.map(ToolCallId::new));
    CreateElicitationRequest::new(
        ElicitationFormMode::new(scope, schema),
        prompt.question.clone(),
    )
}

/// The name of the one field of a clarify form.
pub const CLARIFY_FIELD: &str = "answer";

/// The clarify answer an accepted form carries; `None` when it was declined, cancelled or
/// carries no answer.
pub fn clarify_form_answer(response: &CreateElicitationResponse) -> Option<ClarifyAnswer> {
    let ElicitationAction::Accept(accepted) = &response.action else {
        return None;
    };
    match accepted.content.as_ref()?.get(CLARIFY_FIELD)? {
        ElicitationContentValue::String(text) => Some(ClarifyAnswer::Text(text.clone())),
        ElicitationContentValue::StringArray(choices) => {
            Some(ClarifyAnswer::Choices(choices.clone()))
        }
        _ => None,
    }
}

/// `session/new`'s `mcpServers` as `session.create`'s `mcp_servers`: stdio servers by name
/// (drover starts them for the session's turns). HTTP and SSE servers are refused: the
/// capabilities do not offer them.
pub fn mcp_servers(
    servers: &[McpServer],
) -> Result<Option<BTreeMap<String, SessionMcpServer>>, String> {
    if servers.is_empty() {
        return Ok(None);
    }
    let mut out = BTreeMap::new();
    for server in servers {
        let McpServer::Stdio(stdio) = server else {
            return Err(
                "only stdio MCP servers are supported (mcpCapabilities: http and sse are false)"
                    .to_string(),
            );
        };
        let env = stdio
            .env
            .iter()
            .map(|v| (v.name.clone(), Secret::new(v.value.clone())))
            .collect();
        let spec = SessionMcpServer {
            command: stdio.command.to_string_lossy().into_owned(),
            args: stdio.args.clone(),
            env,
        };
        if out.insert(stdio.name.clone(), spec).is_some() {
            return Err(format!("MCP server {:?} is given twice", stdio.name));
        }
    }
    Ok(Some(out))
}

/// The options of "the last turn's outcome is unknown: resolve it and go on?".
pub fn resolve_options() -> Vec<PermissionOption> {
    vec![
        PermissionOption::new(
            RESOLVE_OPTION,
            "Resolve it as interrupted and run this prompt",
            PermissionOptionKind::AllowOnce,
        ),
        PermissionOption::new(
            KEEP_OPTION,
            "Leave it unresolved (this prompt waits in the queue)",
            PermissionOptionKind::RejectOnce,
        ),
    ]
}

/// The tool calls of the transcript's last turn that have no result yet (the running turn's
/// calls in flight), in order, as they start.
pub fn open_calls(messages: &[TranscriptMessage], cwd: &Path) -> Vec<ToolCall> {
    let last_user = messages
        .iter()
        .rposition(|m| m.role == Role::User)
        .map_or(0, |i| i + 1);
    let turn = &messages[last_user..];
    let answered: HashSet<&str> = turn
        .iter()
        .filter_map(|m| m.tool_call_id.as_deref())
        .collect();
    turn.iter()
        .flat_map(|m| m.tool_calls.iter().flatten())
        .filter(|c| !answered.contains(c.id.as_str()))
        .map(|c| {
            let args: Value = serde_json::from_str(&c.function.arguments)
                .unwrap_or(Value::String(c.function.arguments.clone()));
            tool_started(
                &ToolStart {
                    tool_id: c.id.clone(),
                    name: c.function.name.clone(),
                    context: String::new(),
                    args,
                },
                cwd,
            )
        })
        .collect()
}

/// A whole transcript as the updates `session/load` replays: the user's and the agent's text,
/// and each tool call with its final status and output (`failed` for the ids in `failed`). A
/// call with no result is closed `failed` unless `open_calls_run` (the session's running turn
/// may still finish it).
pub fn replay(
    messages: &[TranscriptMessage],
    cwd: &Path,
    open_calls_run: bool,
    failed: &HashSet<String>,
) -> Vec<SessionUpdate> {
    let mut updates = Vec::new();
    let mut open: Vec<String> = Vec::new();
    let close_open = |open: &mut Vec<String>, updates: &mut Vec<SessionUpdate>| {
        for id in open.drain(..) {
            updates.push(SessionUpdate::ToolCallUpdate(tool_abandoned(
                &id,
                "no result: the turn ended before this call finished",
            )));
        }
    };
    for message in messages {
        match message.role {
            Role::System => {}
            Role::User => {
                close_open(&mut open, &mut updates);
                if let Some(text) = &message.content {
                    updates.push(user_text(text.clone()));
                }
            }
            Role::Assistant => {
                if let Some(text) = message.content.as_deref().filter(|t| !t.is_empty()) {
                    updates.push(agent_text(text.to_string()));
                }
                for call in message.tool_calls.iter().flatten() {
                    let args: Value = serde_json::from_str(&call.function.arguments)
                        .unwrap_or(Value::String(call.function.arguments.clone()));
                    let start = ToolStart {
                        tool_id: call.id.clone(),
                        name: call.function.name.clone(),
                        context: String::new(),
                        args,
                    };
                    let mut started = tool_started(&start, cwd);
                    started.status = ToolCallStatus::Pending;
                    updates.push(SessionUpdate::ToolCall(started));
                    open.push(call.id.clone());
                }
            }
            Role::Tool => {
                let Some(id) = &message.tool_call_id else {
                    continue;
                };
                open.retain(|o| o != id);
                let args = messages
                    .iter()
                    .flat_map(|m| m.tool_calls.iter().flatten())
                    .find(|c| &c.id == id)
                    .and_then(|c| serde_json::from_str(&c.function.arguments).ok())
                    .unwrap_or(Value::Null);
                let done = ToolComplete {
                    tool_id: id.clone(),
                    name: message.tool_name.clone(),
                    args,
                    result: message.content.clone().unwrap_or_default(),
                    is_error: failed.contains(id),
                };
                if message.tool_name.as_deref() == Some("todo") {
                    if let Some(plan) = plan(&done.result) {
                        updates.push(SessionUpdate::Plan(plan));
                    }
                }
                updates.push(SessionUpdate::ToolCallUpdate(tool_completed(&done, cwd)));
            }
        }
    }
    if !open_calls_run {
        close_open(&mut open, &mut updates);
    }
    updates
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_protocol::chat::{FunctionCall, ToolCall as ChatToolCall};
    use serde_json::json;

    fn message(role: Role, content: Option<&str>) -> TranscriptMessage {
        TranscriptMessage {
            id: 0,
            role,
            content: content.map(str::to_string),
            tool_calls: None,
            tool_call_id: None,
            tool_name: None,
            created_at: 0.0,
        }
    }

    fn call(id: &str, name: &str, args: Value) -> ChatToolCall {
        ChatToolCall {
            id: id.into(),
            kind: "function".into(),
            function: FunctionCall {
                name: name.into(),
                arguments: args.to_string(),
            },
        }
    }

    #[test]
    fn each_tool_has_the_kind_an_editor_draws() {
        assert_eq!(tool_kind("terminal"), ToolKind::Execute);
        assert_eq!(tool_kind("read_file"), ToolKind::Read);
        assert_eq!(tool_kind("patch"), ToolKind::Edit);
        assert_eq!(tool_kind("write_file"), ToolKind::Edit);
        assert_eq!(tool_kind("search_files"), ToolKind::Search);
        assert_eq!(tool_kind("todo"), ToolKind::Think);
        assert_eq!(tool_kind("mcp__web__fetch"), ToolKind::Fetch);
        assert_eq!(tool_kind("mcp__x__y"), ToolKind::Other);
    }

    #[test]
    fn a_patch_is_a_diff_at_its_absolute_path() {
        let start = ToolStart {
            tool_id: "t1".into(),
            name: "patch".into(),
            context: "src/a.rs".into(),
            args: json!({"path": "src/a.rs", "old_string": "x", "new_string": "y"}),
        };
        let call = serde_json::to_value(tool_started(&start, Path::new("/w"))).unwrap();
        assert_eq!(call["kind"], "edit");
        assert_eq!(call["status"], "in_progress");
        assert_eq!(call["locations"][0]["path"], "/w/src/a.rs");
        assert_eq!(call["content"][0]["type"], "diff");
        assert_eq!(call["content"][0]["oldText"], "x");
        assert_eq!(call["content"][0]["newText"], "y");
    }

    #[test]
    fn a_terminal_result_shows_its_output_and_a_failure_its_exit_code() {
        let done = ToolComplete {
            tool_id: "t".into(),
            name: Some("terminal".into()),
            args: json!({"command": "false"}),
            result: json!({"output": "hi\n", "exit_code": 1, "error": null}).to_string(),
            is_error: false,
        };
        let update = serde_json::to_value(tool_completed(&done, Path::new("/"))).unwrap();
        assert_eq!(update["status"], "completed");
        assert_eq!(
            update["content"][0]["content"]["text"],
            "hi\n\n[exit code 1]"
        );
        assert_eq!(update["rawOutput"]["exit_code"], 1);
    }

    #[test]
    fn stop_reasons_follow_the_outcome() {
        assert_eq!(
            stop_reason(TurnEnd::Completed, None),
            Ok(StopReason::EndTurn)
        );
        assert_eq!(
            stop_reason(TurnEnd::Interrupted, None),
            Ok(StopReason::Cancelled)
        );
        assert_eq!(
            stop_reason(TurnEnd::Failed, Some("step limit (3) reached")),
            Ok(StopReason::MaxTurnRequests)
        );
        assert_eq!(
            stop_reason(TurnEnd::Failed, Some("HTTP 500")),
            Err("HTTP 500".to_string())
        );
    }

    #[test]
    fn approval_options_name_what_always_covers() {
        let prompt = ApprovalPrompt {
            prompt_id: "p".into(),
            execution_generation: 1,
            command: "rm -rf x".into(),
            description: "recursive delete".into(),
            pattern_key: "recursive_delete".into(),
            choices: vec![
                ApprovalChoice::Once,
                ApprovalChoice::Session,
                ApprovalChoice::Always,
                ApprovalChoice::Deny,
            ],
            class: "deletes files recursively".into(),
            scopes: vec![
                drover_protocol::words::ApprovalScopeOffer {
                    scope: ApprovalScope::Workspace,
                    path: Some("/home/u/proj".into()),
                    text: "every command that deletes files recursively, in /home/u/proj and below (this workspace)".into(),
                },
                drover_protocol::words::ApprovalScopeOffer {
                    scope: ApprovalScope::Everywhere,
                    path: None,
                    text: "every command that deletes files recursively, anywhere, in every session of this home (everywhere)".into(),
                },
            ],
        };
        let options = serde_json::to_value(approval_options(&prompt)).unwrap();
        let kinds: Vec<&str> = options
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["kind"].as_str().unwrap())
            .collect();
        assert_eq!(
            kinds,
            ["allow_once", "allow_always", "allow_always", "reject_once"]
        );
        assert_eq!(
            options[2]["name"],
            "Always allow in this workspace (/home/u/proj)"
        );
        assert_eq!(
            always_scope(&prompt),
            (ApprovalScope::Workspace, Some("/home/u/proj"))
        );
        // A prompt stored before rules had scopes: its rule is everywhere, and says so.
        let old = ApprovalPrompt {
            scopes: Vec::new(),
            ..prompt
        };
        let options = serde_json::to_value(approval_options(&old)).unwrap();
        assert!(options[2]["name"]
            .as_str()
            .unwrap()
            .contains("everywhere (every session"));
        assert_eq!(approval_choice("session"), Some(ApprovalChoice::Session));
        assert_eq!(approval_choice("nope"), None);
    }

    #[test]
    fn a_replay_closes_calls_that_never_got_a_result() {
        let mut assistant = message(Role::Assistant, Some("let me look"));
        assistant.tool_calls = Some(vec![
            call("a", "read_file", json!({"path": "x"})),
            call("b", "terminal", json!({"command": "ls"})),
        ]);
        let mut result = message(Role::Tool, Some("file text"));
        result.tool_call_id = Some("a".into());
        result.tool_name = Some("read_file".into());
        let transcript = vec![
            message(Role::System, Some("sys")),
            message(Role::User, Some("hi")),
            assistant,
            result,
        ];
        let updates: Vec<Value> = replay(&transcript, Path::new("/w"), false, &HashSet::new())
            .into_iter()
            .map(|u| serde_json::to_value(u).unwrap())
            .collect();
        let kinds: Vec<&str> = updates
            .iter()
            .map(|u| u["sessionUpdate"].as_str().unwrap())
            .collect();
        assert_eq!(
            kinds,
            [
                "user_message_chunk",
                "agent_message_chunk",
                "tool_call",
                "tool_call",
                "tool_call_update",
                "tool_call_update"
            ]
        );
        assert_eq!(updates[4]["toolCallId"], "a");
        assert_eq!(updates[4]["status"], "completed");
        assert_eq!(updates[5]["toolCallId"], "b");
        assert_eq!(updates[5]["status"], "failed");
        // While the turn runs, its open call stays open.
        assert_eq!(
            replay(&transcript, Path::new("/w"), true, &HashSet::new()).len(),
            5
        );
        // A call its tool reported as an error replays failed.
        let failed: HashSet<String> = ["a".to_string()].into();
        let updates = replay(&transcript, Path::new("/w"), false, &failed);
        let a = serde_json::to_value(&updates[4]).unwrap();
        assert_eq!(
            (a["toolCallId"].as_str(), a["status"].as_str()),
            (Some("a"), Some("failed"))
        );
    }

    #[test]
    fn a_clarify_question_is_a_form_with_one_answer_field() {
        let prompt = ClarifyPrompt {
            prompt_id: "p".into(),
            execution_generation: 1,
            question: "Which?".into(),
            choices: vec!["a".into(), "b".into()],
            multi_select: false,
        };
        let form = serde_json::to_value(clarify_form(&prompt, "s", Some("t".into()))).unwrap();
        assert_eq!(form["mode"], "form");
        assert_eq!(form["sessionId"], "s");
        assert_eq!(form["toolCallId"], "t");
        assert_eq!(form["message"], "Which?");
        assert_eq!(
            form["requestedSchema"]["properties"]["answer"]["enum"],
            json!(["a", "b"])
        );
        assert_eq!(form["requestedSchema"]["required"], json!(["answer"]));
        let accepted: CreateElicitationResponse =
            serde_json::from_value(json!({"action": "accept", "content": {"answer": "b"}}))
                .unwrap();
        assert_eq!(
            clarify_form_answer(&accepted),
            Some(ClarifyAnswer::Text("b".into()))
        );
        let declined: CreateElicitationResponse =
            serde_json::from_value(json!({"action": "decline"})).unwrap();
        assert_eq!(clarify_form_answer(&declined), None);
    }

    #[test]
    fn stdio_mcp_servers_are_the_sessions_own_and_others_are_refused() {
        let servers: Vec<McpServer> = serde_json::from_value(json!([
            {"name": "fs", "command": "/bin/fs-mcp", "args": ["--root", "/w"],
             "env": [{"name": "TOKEN", "value": "s3cret"}]}
        ]))
        .unwrap();
        let mapped = mcp_servers(&servers).unwrap().unwrap();
        assert_eq!(mapped["fs"].command, "/bin/fs-mcp");
        assert_eq!(mapped["fs"].args, ["--root", "/w"]);
        assert_eq!(mapped["fs"].env["TOKEN"].expose(), "s3cret");
        assert_eq!(mcp_servers(&[]).unwrap(), None);
        let http: Vec<McpServer> = serde_json::from_value(json!([
            {"type": "http", "name": "web", "url": "https://x", "headers": []}
        ]))
        .unwrap();
        assert!(mcp_servers(&http).unwrap_err().contains("only stdio"));
        let twice = [servers[0].clone(), servers[0].clone()];
        assert!(mcp_servers(&twice).unwrap_err().contains("twice"));
    }

    #[test]
    fn a_todo_list_is_a_plan() {
        let plan = plan(
            &json!({"todos": [{"id": "1", "content": "a", "status": "in_progress"},
                               {"id": "2", "content": "b", "status": "pending"}]})
            .to_string(),
        )
        .unwrap();
        let value = serde_json::to_value(plan).unwrap();
        assert_eq!(value["entries"][0]["status"], "in_progress");
        assert_eq!(value["entries"][1]["content"], "b");
    }
}
