//! `session/request_permission` as a drover approval: the prompt's body, the choices by the
//! options' `kind` (their ids differ from agent to agent), and the answer back as one option.

use agent_client_protocol::v1::schema::{
    PermissionOption, PermissionOptionKind, RequestPermissionOutcome, RequestPermissionRequest,
    RequestPermissionResponse, SelectedPermissionOutcome, ToolKind,
};
use drover_protocol::ApprovalMode;
use drover_tools::PromptAnswer;
use serde_json::{json, Value};

/// The drover choice each option kind is shown as.
fn choice_of(kind: PermissionOptionKind) -> Option<&'static str> {
    match kind {
        PermissionOptionKind::AllowOnce => Some("once"),
        PermissionOptionKind::AllowAlways => Some("session"),
        PermissionOptionKind::RejectOnce | PermissionOptionKind::RejectAlways => Some("deny"),
        _ => None,
    }
}

/// The ACP `kind` of a tool call as its snake_case word (`execute`, `edit`, `other`...).
pub fn kind_word(kind: &ToolKind) -> String {
    serde_json::to_value(kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| "other".to_string())
}

/// One permission request, as drover asks it.
#[derive(Debug, Clone, PartialEq)]
pub struct Ask {
    /// The grant key: `agent:<name>:<kind>`.
    pub pattern_key: String,
    /// The `approval` prompt's body.
    pub body: Value,
    options: Vec<PermissionOption>,
}

impl Ask {
    /// The approval of `request` from agent `agent`.
    pub fn new(agent: &str, request: &RequestPermissionRequest) -> Ask {
        let fields = &request.tool_call.fields;
        let title = fields
            .title
            .clone()
            .unwrap_or_else(|| request.tool_call.tool_call_id.0.to_string());
        let kind = kind_word(&fields.kind.unwrap_or_default());
        let pattern_key = format!("agent:{agent}:{kind}");
        let mut choices: Vec<&str> = Vec::new();
        for option in &request.options {
            if let Some(choice) = choice_of(option.kind) {
                if !choices.contains(&choice) {
                    choices.push(choice);
                }
            }
        }
        let body = json!({
            "command": title,
            "description": format!("{agent} asks: {title}"),
            "pattern_key": pattern_key,
            "choices": choices,
        });
        Ask {
            pattern_key,
            body,
            options: request.options.clone(),
        }
    }

    /// The first option of `kinds`, in that order of preference.
    fn option(&self, kinds: &[PermissionOptionKind]) -> Option<RequestPermissionResponse> {
        kinds.iter().find_map(|kind| {
            self.options
                .iter()
                .find(|o| o.kind == *kind)
                .map(|o| selected(o.option_id.0.to_string()))
        })
    }

    /// What drover answers without a human: `auto` allows once, `deny` rejects once, a
    /// granted key allows; `None` when a human must be asked (`manual`).
    pub fn without_prompt(
        &self,
        mode: ApprovalMode,
        granted: bool,
    ) -> Option<RequestPermissionResponse> {
        use PermissionOptionKind::*;
        match mode {
            ApprovalMode::Auto => Some(
                self.option(&[AllowOnce, AllowAlways])
                    .unwrap_or_else(cancelled),
            ),
            ApprovalMode::Deny => Some(
                self.option(&[RejectOnce, RejectAlways])
                    .unwrap_or_else(cancelled),
            ),
            _ if granted => Some(
                self.option(&[AllowOnce, AllowAlways])
                    .unwrap_or_else(cancelled),
            ),
            _ => None,
        }
    }

    /// The human's answer as the agent's option: `once` the allow-once option, `session` or
    /// `always` the allow-always one, `deny` (or anything unreadable) a reject one, each
    /// falling back on its sibling; a cancelled prompt `Cancelled`. Also whether the answer
    /// grants the key for the rest of the turn.
    pub fn answer(&self, answer: &PromptAnswer) -> (RequestPermissionResponse, bool) {
        use PermissionOptionKind::*;
        let choice = match answer {
            PromptAnswer::Answered(Value::String(s)) => s.as_str(),
            PromptAnswer::Answered(_) => "deny",
            PromptAnswer::Cancelled => return (cancelled(), false),
        };
        let (kinds, grants): (&[PermissionOptionKind], bool) = match choice {
            "once" => (&[AllowOnce, AllowAlways], false),
            "session" | "always" => (&[AllowAlways, AllowOnce], true),
            _ => (&[RejectOnce, RejectAlways], false),
        };
        (self.option(kinds).unwrap_or_else(cancelled), grants)
    }
}

fn selected(option_id: String) -> RequestPermissionResponse {
    RequestPermissionResponse::new(RequestPermissionOutcome::Selected(
        SelectedPermissionOutcome::new(option_id),
    ))
}

/// The `cancelled` outcome.
pub fn cancelled() -> RequestPermissionResponse {
    RequestPermissionResponse::new(RequestPermissionOutcome::Cancelled)
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_client_protocol::v1::schema::{ToolCallUpdate, ToolCallUpdateFields};

    fn request(kinds: &[(&str, PermissionOptionKind)]) -> RequestPermissionRequest {
        let options = kinds
            .iter()
            .map(|(id, kind)| PermissionOption::new(id.to_string(), id.to_string(), *kind))
            .collect();
        let fields = ToolCallUpdateFields::new()
            .title("rm -rf build".to_string())
            .kind(ToolKind::Execute);
        RequestPermissionRequest::new("s1", ToolCallUpdate::new("c1", fields), options)
    }

    fn chosen(response: &RequestPermissionResponse) -> Option<String> {
        match &response.outcome {
            RequestPermissionOutcome::Selected(s) => Some(s.option_id.0.to_string()),
            _ => None,
        }
    }

    #[test]
    fn options_map_by_kind_not_by_id() {
        use PermissionOptionKind::*;
        let ask = Ask::new(
            "codex",
            &request(&[
                ("yes", AllowOnce),
                ("yes-all", AllowAlways),
                ("no", RejectOnce),
            ]),
        );
        assert_eq!(ask.pattern_key, "agent:codex:execute");
        assert_eq!(ask.body["choices"], json!(["once", "session", "deny"]));
        assert_eq!(ask.body["command"], "rm -rf build");
        assert_eq!(ask.body["description"], "codex asks: rm -rf build");
        let answer = |a: &str| ask.answer(&PromptAnswer::Answered(json!(a)));
        assert_eq!(chosen(&answer("once").0).as_deref(), Some("yes"));
        assert_eq!(chosen(&answer("session").0).as_deref(), Some("yes-all"));
        assert!(answer("session").1);
        assert_eq!(chosen(&answer("always").0).as_deref(), Some("yes-all"));
        assert_eq!(chosen(&answer("deny").0).as_deref(), Some("no"));
        assert_eq!(chosen(&ask.answer(&PromptAnswer::Cancelled).0), None);
        assert_eq!(
            chosen(&ask.without_prompt(ApprovalMode::Auto, false).unwrap()).as_deref(),
            Some("yes")
        );
        assert_eq!(
            chosen(&ask.without_prompt(ApprovalMode::Deny, true).unwrap()).as_deref(),
            Some("no")
        );
        assert!(ask.without_prompt(ApprovalMode::Manual, false).is_none());
        assert_eq!(
            chosen(&ask.without_prompt(ApprovalMode::Manual, true).unwrap()).as_deref(),
            Some("yes")
        );
    }

    #[test]
    fn a_missing_kind_falls_back_on_its_sibling_or_cancels() {
        use PermissionOptionKind::*;
        let ask = Ask::new(
            "a",
            &request(&[("always", AllowAlways), ("never", RejectAlways)]),
        );
        assert_eq!(ask.body["choices"], json!(["session", "deny"]));
        let answer = |a: &str| chosen(&ask.answer(&PromptAnswer::Answered(json!(a))).0);
        assert_eq!(answer("once").as_deref(), Some("always"));
        assert_eq!(answer("deny").as_deref(), Some("never"));
        let only_allow = Ask::new("a", &request(&[("ok", AllowOnce)]));
        assert_eq!(
            chosen(&only_allow.answer(&PromptAnswer::Answered(json!("deny"))).0),
            None
        );
    }
}
