//! The wire an event goes through after it is recorded locally (SPEC section 7: "records the
//! event locally first, then sends it on the wire").
//!
//! The registry is always first; a [`Wire`] only ever sees events that are already stored,
//! with their seq and signature. With no `[mqtt] url` (and no `$DROVER_MQTT_URL`) the wire is
//! [`LocalOnly`] and `publish` exits 0 after recording. The MQTT wire is a later issue: it
//! implements this trait (send the event to `<topic_prefix>/events`, then the retained
//! snapshot to `<topic_prefix>/state`). Until then a configured URL gives [`NotBuilt`], which
//! reports every send as unreachable (the event stays recorded; `publish` exits 2).

use serde_json::Value;

use crate::registry::Job;
use crate::JobError;

/// What happened to a recorded event on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireOutcome {
    /// No wire is configured: recorded locally, nothing to send (exit 0).
    LocalOnly,
    /// Sent to the broker (exit 0).
    Sent,
    /// Recorded, but the broker could not be reached (exit 2); the reason.
    Unreachable(String),
}

impl WireOutcome {
    /// The word `publish --json` prints in `wire`.
    pub fn as_str(&self) -> &'static str {
        match self {
            WireOutcome::LocalOnly => "local_only",
            WireOutcome::Sent => "sent",
            WireOutcome::Unreachable(_) => "unreachable",
        }
    }
}

/// A transport for recorded events. Implementations never write the registry.
pub trait Wire: Send + Sync {
    /// Sends `message` (a signed event of `job`) and then, unless `state` is `None`
    /// (`--no-state`), the signed state snapshot, on one connection.
    fn send(&self, job: &Job, message: &Value, state: Option<&Value>) -> WireOutcome;
}

/// No wire: every event stays local.
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalOnly;

impl Wire for LocalOnly {
    fn send(&self, _job: &Job, _message: &Value, _state: Option<&Value>) -> WireOutcome {
        WireOutcome::LocalOnly
    }
}

/// A wire is configured, but this build has no MQTT client yet: every send is unreachable.
#[derive(Debug, Clone)]
pub struct NotBuilt {
    pub url: String,
}

impl Wire for NotBuilt {
    fn send(&self, _job: &Job, _message: &Value, _state: Option<&Value>) -> WireOutcome {
        WireOutcome::Unreachable(format!(
            "[mqtt] url is {} but this drover has no MQTT wire yet (it comes with remote \
             runners); the event is recorded locally only",
            redact_url(&self.url)
        ))
    }
}

/// The wire settings: `[mqtt] url` from the home's `config.toml`, overridden by
/// `$DROVER_MQTT_URL`, and `topic_base` (default `drover/v1`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireSettings {
    pub url: Option<String>,
    pub topic_base: String,
}

/// `[mqtt] topic_base` when none is configured.
pub const DEFAULT_TOPIC_BASE: &str = "drover/v1";

impl WireSettings {
    /// Combines the config values with `$DROVER_MQTT_URL` (`env_url`): a set variable wins,
    /// and an empty one means no wire. The URL must be `mqtt://` or `mqtts://`.
    pub fn resolve(
        config_url: Option<String>,
        env_url: Option<String>,
        topic_base: Option<String>,
    ) -> Result<WireSettings, JobError> {
        let url = match env_url {
            Some(v) => Some(v),
            None => config_url,
        }
        .filter(|u| !u.trim().is_empty());
        if let Some(u) = &url {
            if !(u.starts_with("mqtt://") || u.starts_with("mqtts://")) {
                return Err(JobError::BadInput(format!(
                    "the MQTT url {} must start with mqtt:// or mqtts:// ([mqtt] url in \
                     config.toml, or $DROVER_MQTT_URL)",
                    redact_url(u)
                )));
            }
        }
        let topic_base = topic_base
            .filter(|t| !t.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_TOPIC_BASE.to_string());
        Ok(WireSettings { url, topic_base })
    }

    /// The wire these settings name.
    pub fn wire(&self) -> Box<dyn Wire> {
        match &self.url {
            None => Box::new(LocalOnly),
            Some(url) => Box::new(NotBuilt { url: url.clone() }),
        }
    }

    /// Whether a wire is configured (`watch` needs one).
    pub fn configured(&self) -> bool {
        self.url.is_some()
    }
}

/// `scheme://user:pass@host` printed without the credentials.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}://***@{}", &url[..scheme_end], &url[at + 1..])
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_url_means_local_only_and_the_env_overrides_the_config() {
        let s = WireSettings::resolve(None, None, None).unwrap();
        assert_eq!(s.url, None);
        assert_eq!(s.topic_base, "drover/v1");
        assert!(!s.configured());
        let s = WireSettings::resolve(
            Some("mqtt://config:1883".into()),
            Some("mqtts://env:8883".into()),
            Some("team/x".into()),
        )
        .unwrap();
        assert_eq!(s.url.as_deref(), Some("mqtts://env:8883"));
        assert_eq!(s.topic_base, "team/x");
        let s = WireSettings::resolve(Some("mqtt://config:1883".into()), Some(String::new()), None)
            .unwrap();
        assert_eq!(s.url, None, "an empty $DROVER_MQTT_URL turns the wire off");
    }

    #[test]
    fn a_url_of_another_scheme_is_refused_without_its_password() {
        let e = WireSettings::resolve(Some("http://u:secret@host".into()), None, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("mqtt://"), "{e}");
        assert!(!e.contains("secret"), "{e}");
    }

    #[test]
    fn redact_hides_credentials_only() {
        assert_eq!(redact_url("mqtt://a:b@h:1"), "mqtt://***@h:1");
        assert_eq!(redact_url("mqtt://h:1"), "mqtt://h:1");
    }
}
