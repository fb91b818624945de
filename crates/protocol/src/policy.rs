//! Typed settings that cross from `config.toml` through the owner to the worker (SPEC sections
//! 1, 4 and 6): the approval mode and the model client settings, each with its defaults
//! written once, here.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use std::borrow::Cow;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

/// `approvals.mode` (SPEC sections 1 and 6). On the wire and in `config.toml` it is the
/// lowercase word; any other value is refused with an error naming `approvals.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", try_from = "String")]
pub enum ApprovalMode {
    /// Ask the user before a dangerous command runs (the default).
    #[default]
    Manual,
    /// Run dangerous commands without asking.
    Auto,
    /// Refuse dangerous commands without asking.
    Deny,
}

impl ApprovalMode {
    /// Every mode, in the order the docs list them.
    pub const ALL: [ApprovalMode; 3] =
        [ApprovalMode::Manual, ApprovalMode::Auto, ApprovalMode::Deny];

    /// The config and wire spelling: `manual`, `auto` or `deny`.
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalMode::Manual => "manual",
            ApprovalMode::Auto => "auto",
            ApprovalMode::Deny => "deny",
        }
    }
}

/// Written by hand: the derive would follow `try_from = "String"` and describe any string.
impl JsonSchema for ApprovalMode {
    fn schema_name() -> Cow<'static, str> {
        "ApprovalMode".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "An approval mode: `manual` (ask before a dangerous command runs), \
                `auto` (run it without asking) or `deny` (refuse it without asking).",
            "type": "string",
            "enum": ["manual", "auto", "deny"],
        })
    }
}

impl fmt::Display for ApprovalMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A value that is not one of the accepted spellings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field} {value:?} (expected one of: {expected})")]
pub struct ParseError {
    /// The setting or answer field that was wrong (`approvals.mode`, `choice`).
    pub field: &'static str,
    /// The value given.
    pub value: String,
    /// The accepted values, comma-separated.
    pub expected: &'static str,
}

impl FromStr for ApprovalMode {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ApprovalMode::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| ParseError {
                field: "approvals.mode",
                value: s.to_string(),
                expected: "manual, auto, deny",
            })
    }
}

/// Lets serde refuse an unknown mode with [`ParseError`]'s message (which names
/// `approvals.mode`) rather than its generic "unknown variant".
impl TryFrom<String> for ApprovalMode {
    type Error = ParseError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

/// The model client settings of `[model]` that a session freezes at `session.create` and the
/// worker's client uses (SPEC sections 1 and 5). Missing fields take their defaults, so a
/// stored `model_config` or a `[model]` table may leave any of them out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ModelSettings {
    /// Server-sent events (`true`) or one JSON body (`false`).
    pub stream: bool,
    /// Whole-request timeout in seconds (connect to last byte); 0 means the default.
    pub request_timeout_s: u64,
    /// Retries after the first attempt, for timeouts, 429, 5xx, connection errors and stalls
    /// (SPEC section 5: bounded).
    pub max_retries: u32,
    /// Seconds a response may go without sending a byte before the request is cancelled as
    /// stalled (SPEC section 1: `[model] stall_timeout_s`); 0 means the default.
    pub stall_timeout_s: u64,
    /// Which API the endpoint speaks: `chat` (Chat Completions, the default) or `responses`.
    pub api: ModelApi,
    /// Seconds to open a connection to the endpoint (TCP and TLS); 0 means the default (10).
    pub connect_timeout_s: u64,
    /// Seconds from a request sent to its first response byte; 0 means the default (60).
    pub first_byte_timeout_s: u64,
}

/// `[model] api`: the OpenAI API the endpoint is spoken to with (SPEC section 9, "Model
/// endpoints").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelApi {
    /// `POST {base_url}/chat/completions`.
    #[default]
    Chat,
    /// `POST {base_url}/responses`.
    Responses,
}

impl ModelApi {
    /// The config word.
    pub fn as_str(self) -> &'static str {
        match self {
            ModelApi::Chat => "chat",
            ModelApi::Responses => "responses",
        }
    }
}

impl ModelSettings {
    /// The default whole-request timeout.
    pub const DEFAULT_REQUEST_TIMEOUT_S: u64 = 600;
    /// The default stall bound (SPEC section 1: 120 s).
    pub const DEFAULT_STALL_TIMEOUT_S: u64 = 120;
    /// The default connect bound (SPEC section 9: 10 s).
    pub const DEFAULT_CONNECT_TIMEOUT_S: u64 = 10;
    /// The default first-byte bound (SPEC section 9: 60 s).
    pub const DEFAULT_FIRST_BYTE_TIMEOUT_S: u64 = 60;

    /// How long opening a connection may take; 0 means the default (10 s).
    pub fn connect_timeout(&self) -> Duration {
        match self.connect_timeout_s {
            0 => Duration::from_secs(Self::DEFAULT_CONNECT_TIMEOUT_S),
            s => Duration::from_secs(s),
        }
    }

    /// How long a sent request may wait for its first response byte; 0 means the default
    /// (60 s).
    pub fn first_byte_timeout(&self) -> Duration {
        match self.first_byte_timeout_s {
            0 => Duration::from_secs(Self::DEFAULT_FIRST_BYTE_TIMEOUT_S),
            s => Duration::from_secs(s),
        }
    }

    /// The whole-request timeout. A `request_timeout_s` of 0 means the default (600 s), not
    /// "time out at once".
    pub fn request_timeout(&self) -> Duration {
        match self.request_timeout_s {
            0 => Duration::from_secs(Self::DEFAULT_REQUEST_TIMEOUT_S),
            s => Duration::from_secs(s),
        }
    }

    /// How long a response may send no byte (SPEC section 5: a stalled stream is cancelled
    /// and retried). A `stall_timeout_s` of 0 means the default (120 s).
    pub fn stall_timeout(&self) -> Duration {
        match self.stall_timeout_s {
            0 => Duration::from_secs(Self::DEFAULT_STALL_TIMEOUT_S),
            s => Duration::from_secs(s),
        }
    }
}

/// Stream on, 600 s timeout, 3 retries, 120 s stall bound, Chat Completions, 10 s to connect,
/// 60 s to the first byte.
impl Default for ModelSettings {
    fn default() -> Self {
        ModelSettings {
            stream: true,
            request_timeout_s: Self::DEFAULT_REQUEST_TIMEOUT_S,
            max_retries: 3,
            stall_timeout_s: Self::DEFAULT_STALL_TIMEOUT_S,
            api: ModelApi::Chat,
            connect_timeout_s: Self::DEFAULT_CONNECT_TIMEOUT_S,
            first_byte_timeout_s: Self::DEFAULT_FIRST_BYTE_TIMEOUT_S,
        }
    }
}

/// How much of the model's context window a turn may fill before it compacts
/// (`[model] context_window`, `compact_at`, `keep_recent_turns`), frozen per session.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ContextBudget {
    /// The model's context window in tokens; 0 means "ask the endpoint's `GET /models`, else
    /// [`ContextBudget::DEFAULT_CONTEXT_WINDOW`]".
    pub context_window: u64,
    /// The share of the window a request may fill (0.1 to 1.0) before older history is
    /// compacted.
    pub compact_at: f64,
    /// Earlier turns kept verbatim by a compaction, beside the running turn.
    pub keep_recent_turns: u32,
}

impl ContextBudget {
    /// The window assumed when neither `[model] context_window` nor the endpoint gives one.
    pub const DEFAULT_CONTEXT_WINDOW: u64 = 128_000;
    /// The default share of the window a request may fill.
    pub const DEFAULT_COMPACT_AT: f64 = 0.8;
    /// The default number of earlier turns a compaction keeps verbatim.
    pub const DEFAULT_KEEP_RECENT_TURNS: u32 = 2;

    /// The largest request, in tokens, that `window` allows before a compaction is due.
    pub fn budget_tokens(&self, window: u64) -> u64 {
        let share = if self.compact_at.is_finite() {
            self.compact_at.clamp(0.1, 1.0)
        } else {
            Self::DEFAULT_COMPACT_AT
        };
        (window as f64 * share) as u64
    }
}

/// No fixed window (ask the endpoint), compact at 0.8, keep 2 earlier turns.
impl Default for ContextBudget {
    fn default() -> Self {
        ContextBudget {
            context_window: 0,
            compact_at: Self::DEFAULT_COMPACT_AT,
            keep_recent_turns: Self::DEFAULT_KEEP_RECENT_TURNS,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn approval_modes_round_trip_their_lowercase_spelling() {
        for mode in ApprovalMode::ALL {
            assert_eq!(mode.as_str().parse::<ApprovalMode>(), Ok(mode));
            let wire = serde_json::to_value(mode).expect("serialize");
            assert_eq!(wire, json!(mode.as_str()));
            assert_eq!(
                serde_json::from_value::<ApprovalMode>(wire).expect("deserialize"),
                mode
            );
        }
        assert_eq!(ApprovalMode::default(), ApprovalMode::Manual);
    }

    #[test]
    fn an_unknown_approval_mode_is_refused_naming_the_field() {
        let err = "yolo".parse::<ApprovalMode>().expect_err("invalid");
        assert_eq!(
            err.to_string(),
            r#"invalid approvals.mode "yolo" (expected one of: manual, auto, deny)"#
        );
        // Case matters: the spelling is the lowercase word only.
        assert!("Manual".parse::<ApprovalMode>().is_err());
        let err = serde_json::from_value::<ApprovalMode>(json!("always")).expect_err("invalid");
        assert!(err.to_string().contains("approvals.mode"), "{err}");
        assert!(serde_json::from_value::<ApprovalMode>(json!(1)).is_err());
    }

    #[test]
    fn model_settings_defaults_fill_missing_fields() {
        let d = ModelSettings::default();
        assert_eq!(
            (
                d.stream,
                d.request_timeout_s,
                d.max_retries,
                d.stall_timeout_s
            ),
            (true, 600, 3, 120)
        );
        let partial: ModelSettings =
            serde_json::from_value(json!({"stream": false, "base_url": "http://x"}))
                .expect("partial");
        assert_eq!(
            partial,
            ModelSettings {
                stream: false,
                ..ModelSettings::default()
            }
        );
        assert_eq!(
            serde_json::to_value(d).expect("serialize"),
            json!({"stream": true, "request_timeout_s": 600, "max_retries": 3, "stall_timeout_s": 120,
                   "api": "chat", "connect_timeout_s": 10, "first_byte_timeout_s": 60})
        );
    }

    #[test]
    fn a_policy_frame_keeps_its_flat_wire_fields() {
        let frame = json!({
            "model": "m", "base_url": "http://127.0.0.1:1/v1", "api_key": null,
            "stream": false, "request_timeout_s": 30, "max_retries": 0, "stall_timeout_s": 7,
            "api": "responses", "connect_timeout_s": 3, "first_byte_timeout_s": 4,
            "system_prompt": "", "toolsets": [], "tools": [], "cwd": "/", "max_steps": 1,
            "approvals": "deny", "home": "/h", "approval_grants": [],
            "background_processes": [], "mcp_servers": {},
            "jobs_wire": {"url": null, "username_env": null, "password_env": null,
                          "topic_base": null},
            "sandbox": {"mode": "off", "writable_roots": [], "network": true, "hidden": [],
                        "required": false,
                        "support": {"namespaces": false, "landlock_abi": null, "problems": []},
                        "env": {"keep": [], "set": {}}},
            "context": {"context_window": 0, "compact_at": 0.8, "keep_recent_turns": 2},
        });
        let policy: crate::worker::Policy = serde_json::from_value(frame.clone()).expect("policy");
        assert_eq!(policy.approvals, ApprovalMode::Deny);
        assert_eq!(
            policy.model_settings,
            ModelSettings {
                stream: false,
                request_timeout_s: 30,
                max_retries: 0,
                stall_timeout_s: 7,
                api: ModelApi::Responses,
                connect_timeout_s: 3,
                first_byte_timeout_s: 4,
            }
        );
        assert_eq!(serde_json::to_value(&policy).expect("serialize"), frame);
        let mut bad = frame;
        bad["approvals"] = json!("yes");
        let err = serde_json::from_value::<crate::worker::Policy>(bad).expect_err("bad mode");
        assert!(err.to_string().contains("approvals.mode"), "{err}");
    }

    #[test]
    fn a_zero_request_timeout_means_the_default() {
        let zero = ModelSettings {
            request_timeout_s: 0,
            ..ModelSettings::default()
        };
        assert_eq!(zero.request_timeout(), Duration::from_secs(600));
        let five = ModelSettings {
            request_timeout_s: 5,
            ..ModelSettings::default()
        };
        assert_eq!(five.request_timeout(), Duration::from_secs(5));
    }

    #[test]
    fn a_zero_stall_timeout_means_the_default() {
        let zero = ModelSettings {
            stall_timeout_s: 0,
            ..ModelSettings::default()
        };
        assert_eq!(zero.stall_timeout(), Duration::from_secs(120));
        let two = ModelSettings {
            stall_timeout_s: 2,
            ..ModelSettings::default()
        };
        assert_eq!(two.stall_timeout(), Duration::from_secs(2));
    }
}
