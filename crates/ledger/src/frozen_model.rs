//! [`FrozenModel`]: the model client settings a session freezes at `session.create`, stored
//! in `sessions.model_config` and read back as themselves (SPEC section 4, "Frozen session").

use drover_protocol::policy::{ContextBudget, ModelApi, ModelSettings};
use drover_protocol::Secret;
use serde::{Deserialize, Serialize};

/// `sessions.model_config`: `{base_url, stream, request_timeout_s, max_retries,
/// stall_timeout_s, context, api_key?}`. A row written before a field existed reads without
/// it: a missing model setting takes [`ModelSettings`]' default, a missing `stall_timeout_s`
/// or `context` the daemon's `[model]` settings of the turn ([`FrozenModel::settings`],
/// [`FrozenModel::context`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FrozenModel {
    /// The model endpoint.
    #[serde(default)]
    pub base_url: String,
    /// Server-sent events or one JSON body.
    #[serde(default = "defaults::stream")]
    pub stream: bool,
    /// Whole-request timeout in seconds; 0 means the default.
    #[serde(default = "defaults::request_timeout_s")]
    pub request_timeout_s: u64,
    /// Retries after the first attempt.
    #[serde(default = "defaults::max_retries")]
    pub max_retries: u32,
    /// Seconds a response may send nothing; `None` in a row older than the setting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stall_timeout_s: Option<u64>,
    /// The context budget; `None` in a row older than compaction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<ContextBudget>,
    /// The session's own API key (`session.create` `api_key`); `None`: the daemon's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<Secret>,
    /// The endpoint's API; `None` in a row older than the setting (Chat Completions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api: Option<ModelApi>,
    /// Seconds to connect; `None` in a row older than the setting (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_timeout_s: Option<u64>,
    /// Seconds to the first byte; `None` in a row older than the setting (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_byte_timeout_s: Option<u64>,
}

impl FrozenModel {
    /// What a session created now freezes: `settings`, `context` and the endpoint.
    pub fn new(
        base_url: String,
        settings: ModelSettings,
        context: ContextBudget,
        api_key: Option<Secret>,
    ) -> FrozenModel {
        FrozenModel {
            base_url,
            stream: settings.stream,
            request_timeout_s: settings.request_timeout_s,
            max_retries: settings.max_retries,
            stall_timeout_s: Some(settings.stall_timeout_s),
            context: Some(context),
            api_key,
            api: Some(settings.api),
            connect_timeout_s: Some(settings.connect_timeout_s),
            first_byte_timeout_s: Some(settings.first_byte_timeout_s),
        }
    }

    /// Reads a stored `model_config`. Settings that do not read (a hand-edited row) fall back
    /// to their defaults, keeping the endpoint, the key and the context budget when those
    /// read, so the session stays usable; only text that is not JSON is an error.
    pub fn read(text: &str) -> Result<FrozenModel, serde_json::Error> {
        let stored: serde_json::Value = serde_json::from_str(text)?;
        Ok(match FrozenModel::deserialize(&stored) {
            Ok(frozen) => frozen,
            Err(e) => {
                tracing::warn!(error = %e, "unreadable model_config settings; using the defaults");
                let field = |name: &str| stored.get(name).cloned().unwrap_or_default();
                FrozenModel {
                    base_url: String::deserialize(field("base_url")).unwrap_or_default(),
                    context: Option::deserialize(field("context")).unwrap_or_default(),
                    api_key: Option::deserialize(field("api_key")).unwrap_or_default(),
                    ..FrozenModel::default()
                }
            }
        })
    }

    /// The model client settings; a row that froze no `stall_timeout_s` gets `stall_now`.
    pub fn settings(&self, stall_now: u64) -> ModelSettings {
        ModelSettings {
            stream: self.stream,
            request_timeout_s: self.request_timeout_s,
            max_retries: self.max_retries,
            stall_timeout_s: self.stall_timeout_s.unwrap_or(stall_now),
            api: self.api.unwrap_or_default(),
            connect_timeout_s: self
                .connect_timeout_s
                .unwrap_or(ModelSettings::DEFAULT_CONNECT_TIMEOUT_S),
            first_byte_timeout_s: self
                .first_byte_timeout_s
                .unwrap_or(ModelSettings::DEFAULT_FIRST_BYTE_TIMEOUT_S),
        }
    }

    /// The frozen context budget; `now` for a row that froze none.
    pub fn context(&self, now: ContextBudget) -> ContextBudget {
        self.context.unwrap_or(now)
    }
}

/// A blank row: every field missing.
impl Default for FrozenModel {
    fn default() -> FrozenModel {
        FrozenModel {
            base_url: String::new(),
            stream: defaults::stream(),
            request_timeout_s: defaults::request_timeout_s(),
            max_retries: defaults::max_retries(),
            stall_timeout_s: None,
            context: None,
            api_key: None,
            api: None,
            connect_timeout_s: None,
            first_byte_timeout_s: None,
        }
    }
}

/// [`ModelSettings`]' defaults, field by field, for serde.
mod defaults {
    use drover_protocol::policy::ModelSettings;

    pub(super) fn stream() -> bool {
        ModelSettings::default().stream
    }

    pub(super) fn request_timeout_s() -> u64 {
        ModelSettings::default().request_timeout_s
    }

    pub(super) fn max_retries() -> u32 {
        ModelSettings::default().max_retries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stored as the owner wrote it before the settings were typed (same keys, same order),
    /// and an old row missing fields reads with their defaults.
    #[test]
    fn the_frozen_model_is_stored_as_it_was_and_an_old_row_reads() {
        let settings = ModelSettings {
            stream: false,
            request_timeout_s: 30,
            max_retries: 1,
            stall_timeout_s: 9,
            api: ModelApi::Responses,
            connect_timeout_s: 3,
            first_byte_timeout_s: 4,
        };
        let context = ContextBudget {
            context_window: 1000,
            compact_at: 0.5,
            keep_recent_turns: 2,
        };
        let frozen = FrozenModel::new("http://m/v1".into(), settings, context, Some("k".into()));
        assert_eq!(
            serde_json::to_string(&frozen).expect("serialise"),
            r#"{"base_url":"http://m/v1","stream":false,"request_timeout_s":30,"max_retries":1,"stall_timeout_s":9,"context":{"context_window":1000,"compact_at":0.5,"keep_recent_turns":2},"api_key":"k","api":"responses","connect_timeout_s":3,"first_byte_timeout_s":4}"#
        );
        let old: FrozenModel =
            serde_json::from_str(r#"{"base_url":"http://m/v1","stream":false}"#).expect("old row");
        let now = ModelSettings::default();
        assert_eq!(
            old.settings(77),
            ModelSettings {
                stream: false,
                stall_timeout_s: 77,
                ..now
            }
        );
        assert_eq!(old.context(context), context);
        assert_eq!(old.api_key, None);
    }

    /// A frozen stall bound is kept whatever the daemon says now; a row without one gets the
    /// daemon's of now; settings that do not read fall back to the defaults and keep the
    /// endpoint.
    #[test]
    fn a_frozen_stall_bound_is_kept_and_unreadable_settings_fall_back() {
        let read = |text: &str| FrozenModel::read(text).expect("JSON");
        assert_eq!(
            read(r#"{"stall_timeout_s":40}"#)
                .settings(17)
                .stall_timeout_s,
            40
        );
        assert_eq!(
            read(r#"{"stream":false,"max_retries":1}"#)
                .settings(17)
                .stall_timeout_s,
            17
        );
        let unreadable = read(r#"{"base_url":"http://m/v1","stream":"yes"}"#);
        assert_eq!(
            unreadable.settings(17),
            ModelSettings {
                stall_timeout_s: 17,
                ..ModelSettings::default()
            }
        );
        assert_eq!(unreadable.base_url, "http://m/v1");
        assert!(FrozenModel::read("not json").is_err());
    }
}
