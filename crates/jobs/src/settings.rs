//! The wire settings (SPEC section 7, "wire"): `[mqtt]` of the home's `config.toml`
//! ([`WireConfig`]) combined with `$DROVER_MQTT_URL` and the credential variables into
//! [`WireSettings`]. Pure: the wire the settings name is built by the `mqtt` module
//! ([`WireSettings::wire`]), so the settings sit below the wire they choose.

use crate::broker_endpoint::{redact_url, Endpoint};
use crate::JobError;

/// `[mqtt]` as the home's `config.toml` gives it (all optional).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WireConfig {
    /// `[mqtt] url`: `mqtt://...` or `mqtts://...` (`$DROVER_MQTT_URL` overrides it).
    pub url: Option<String>,
    /// The variable that holds the broker user name.
    pub username_env: Option<String>,
    /// The variable that holds the broker password.
    pub password_env: Option<String>,
    /// `[mqtt] topic_base` (default `drover/v1`).
    pub topic_base: Option<String>,
}

/// The wire settings: `[mqtt] url` from the home's `config.toml`, overridden by
/// `$DROVER_MQTT_URL`, the broker credentials from the variables `username_env` and
/// `password_env` name, and `topic_base` (default `drover/v1`).
#[derive(Clone, PartialEq, Eq)]
pub struct WireSettings {
    /// The broker URL in effect (`$DROVER_MQTT_URL`, else `[mqtt] url`); `None`: no wire,
    /// local only.
    pub url: Option<String>,
    /// The parsed URL plus credentials; `Some` exactly when `url` is.
    pub endpoint: Option<Endpoint>,
    /// `[mqtt] topic_base`, or `drover/v1`: a plain topic (no `+`, `#`, not starting `$`).
    pub topic_base: String,
}

impl std::fmt::Debug for WireSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WireSettings")
            .field("url", &self.url.as_deref().map(redact_url))
            .field("endpoint", &self.endpoint)
            .field("topic_base", &self.topic_base)
            .finish()
    }
}

/// `[mqtt] topic_base` when none is configured.
pub const DEFAULT_TOPIC_BASE: &str = "drover/v1";
/// The variable that overrides `[mqtt] url`.
pub const MQTT_URL_ENV: &str = "DROVER_MQTT_URL";

impl WireSettings {
    /// Combines the config values with the environment (`env` looks a variable up):
    /// `$DROVER_MQTT_URL` wins over `[mqtt] url`, and a set but empty one means no wire. The
    /// URL must be `mqtt://` or `mqtts://`; a credential variable the config names must be set.
    pub fn from_config(
        config: WireConfig,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<WireSettings, JobError> {
        let mut settings = WireSettings::resolve(config.url, env(MQTT_URL_ENV), config.topic_base)?;
        if let Some(endpoint) = settings.endpoint.as_mut() {
            let var = |name: &Option<String>, what: &str| -> Result<Option<String>, JobError> {
                let Some(name) = name.as_deref().filter(|n| !n.trim().is_empty()) else {
                    return Ok(None);
                };
                env(name).map(Some).ok_or_else(|| {
                    JobError::BadInput(format!(
                        "[mqtt] {what}_env names ${name}, which is not set (the broker {what} \
                         goes there)"
                    ))
                })
            };
            if let Some(user) = var(&config.username_env, "username")? {
                endpoint.username = Some(user);
            }
            if let Some(pass) = var(&config.password_env, "password")? {
                endpoint.password = Some(pass);
            }
        }
        Ok(settings)
    }

    /// Combines a config URL with `$DROVER_MQTT_URL` (`env_url`): a set variable wins, and an
    /// empty one means no wire. The URL must be `mqtt://` or `mqtts://`.
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
        let endpoint = url.as_deref().map(Endpoint::parse).transpose()?;
        let topic_base = topic_base
            .filter(|t| !t.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_TOPIC_BASE.to_string());
        if topic_base.contains(['+', '#', '\0']) || topic_base.starts_with('$') {
            return Err(JobError::BadInput(format!(
                "[mqtt] topic_base {topic_base:?} must be a plain MQTT topic (no '+', '#', NUL, \
                 and not starting with '$')"
            )));
        }
        Ok(WireSettings {
            url,
            endpoint,
            topic_base,
        })
    }

    /// Whether a wire is configured (`watch` needs one).
    pub fn configured(&self) -> bool {
        self.endpoint.is_some()
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
        let e = s.endpoint.as_ref().unwrap();
        assert!(e.tls);
        assert_eq!((e.host.as_str(), e.port), ("env", 8883));
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
    fn a_wildcard_topic_base_is_refused() {
        for bad in ["a/+/b", "a/#", "$SYS/x"] {
            assert!(
                WireSettings::resolve(None, None, Some(bad.into())).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn credentials_come_from_the_variables_the_config_names() {
        let config = WireConfig {
            url: Some("mqtt://broker".into()),
            username_env: Some("MQ_USER".into()),
            password_env: Some("MQ_PASS".into()),
            topic_base: None,
        };
        let env = |name: &str| match name {
            "MQ_USER" => Some("alice".to_string()),
            "MQ_PASS" => Some("s3cret".to_string()),
            _ => None,
        };
        let s = WireSettings::from_config(config.clone(), env).unwrap();
        let e = s.endpoint.as_ref().unwrap();
        assert_eq!(e.username.as_deref(), Some("alice"));
        assert_eq!(e.password.as_deref(), Some("s3cret"));
        assert_eq!(e.port, 1883);
        assert!(!format!("{s:?}").contains("s3cret"), "{s:?}");
        // A named variable that is not set is a one-line error naming it.
        let e = WireSettings::from_config(config.clone(), |_| None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("$MQ_USER"), "{e}");
        // $DROVER_MQTT_URL wins over [mqtt] url; an empty one turns the wire off.
        let s = WireSettings::from_config(config, |name| match name {
            MQTT_URL_ENV => Some(String::new()),
            _ => None,
        })
        .unwrap();
        assert!(!s.configured());
    }
}
