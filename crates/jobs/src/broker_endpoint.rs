//! A broker address (SPEC section 7, "wire"): [`Endpoint`], parsed from `[mqtt] url` or
//! `$DROVER_MQTT_URL`, with its credentials kept out of `Debug` and `Display`, and
//! [`redact_url`]. Pure: the MQTT client that connects to it is the `mqtt` module.

use crate::JobError;

/// A broker address from `[mqtt] url` / `$DROVER_MQTT_URL`, plus credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `mqtts://`.
    pub tls: bool,
    /// The host name or address (an IPv6 address without its brackets).
    pub host: String,
    /// The port (default 1883, or 8883 for `mqtts://`).
    pub port: u16,
    /// The user name: from the URL, or from the variable `[mqtt] username_env` names.
    pub username: Option<String>,
    /// The password: from the URL, or from the variable `[mqtt] password_env` names. Never
    /// in `Debug` or `Display`.
    pub password: Option<String>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("tls", &self.tls)
            .field("host", &self.host)
            .field("port", &self.port)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish()
    }
}

impl std::fmt::Display for Endpoint {
    /// The URL without credentials.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.tls { "mqtts" } else { "mqtt" };
        if self.host.contains(':') {
            write!(f, "{scheme}://[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{scheme}://{}:{}", self.host, self.port)
        }
    }
}

impl Endpoint {
    /// Parses `mqtt://[user[:password]@]host[:port][/]` or `mqtts://...` (default ports 1883
    /// and 8883; an IPv6 host in brackets). Credentials in the URL are taken as written;
    /// `username_env` / `password_env` override them.
    pub fn parse(url: &str) -> Result<Endpoint, JobError> {
        let bad = |why: &str| {
            JobError::BadInput(format!(
                "the MQTT url {} {why} ([mqtt] url in config.toml, or $DROVER_MQTT_URL)",
                redact_url(url)
            ))
        };
        let url = url.trim();
        let (tls, rest) = if let Some(rest) = url.strip_prefix("mqtt://") {
            (false, rest)
        } else if let Some(rest) = url.strip_prefix("mqtts://") {
            (true, rest)
        } else {
            return Err(bad("must start with mqtt:// or mqtts://"));
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains(['/', '?', '#']) {
            return Err(bad("must be only scheme://host:port (no path or query)"));
        }
        let (userinfo, hostport) = match rest.rfind('@') {
            Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
            None => (None, rest),
        };
        let (username, password) = match userinfo {
            Some(info) => match info.split_once(':') {
                Some((u, p)) => (Some(u.to_string()), Some(p.to_string())),
                None => (Some(info.to_string()), None),
            },
            None => (None, None),
        };
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (host, after) = v6
                .split_once(']')
                .ok_or_else(|| bad("has an IPv6 host without its closing ']'"))?;
            let port = match after {
                "" => None,
                p => Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| bad("has junk after the host"))?,
                ),
            };
            (host, port)
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            }
        };
        if host.is_empty() {
            return Err(bad("has no host"));
        }
        let port = match port {
            None => {
                if tls {
                    8883
                } else {
                    1883
                }
            }
            Some(p) => match p.parse::<u16>() {
                Ok(n) if n > 0 => n,
                _ => return Err(bad("has a port that is not a number from 1 to 65535")),
            },
        };
        Ok(Endpoint {
            tls,
            host: host.to_string(),
            port,
            username,
            password,
        })
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
    fn urls_parse_with_default_ports_ipv6_and_credentials() {
        let e = Endpoint::parse("mqtt://broker").unwrap();
        assert_eq!((e.tls, e.host.as_str(), e.port), (false, "broker", 1883));
        let e = Endpoint::parse("mqtts://broker.example/").unwrap();
        assert_eq!((e.tls, e.port), (true, 8883));
        let e = Endpoint::parse("mqtt://127.0.0.1:18830").unwrap();
        assert_eq!((e.host.as_str(), e.port), ("127.0.0.1", 18830));
        assert_eq!(e.to_string(), "mqtt://127.0.0.1:18830");
        let e = Endpoint::parse("mqtt://[::1]:1884").unwrap();
        assert_eq!((e.host.as_str(), e.port), ("::1", 1884));
        assert_eq!(e.to_string(), "mqtt://[::1]:1884");
        let e = Endpoint::parse("mqtt://bob:p@ss@h:1").unwrap();
        assert_eq!(e.username.as_deref(), Some("bob"));
        assert_eq!(e.password.as_deref(), Some("p@ss"));
        assert!(!format!("{e:?}").contains("p@ss"));
        assert!(!e.to_string().contains("bob"));
    }

    #[test]
    fn bad_urls_are_one_line_errors_without_the_password() {
        for bad in [
            "http://h",
            "mqtt://",
            "mqtt://h:0",
            "mqtt://h:99999",
            "mqtt://h:x",
            "mqtt://h/topic",
            "mqtt://[::1",
            "mqtt://u:secret@h:port",
        ] {
            let e = Endpoint::parse(bad).unwrap_err().to_string();
            assert!(!e.contains('\n') && !e.contains("secret"), "{bad}: {e}");
        }
    }

    #[test]
    fn redact_hides_credentials_only() {
        assert_eq!(redact_url("mqtt://a:b@h:1"), "mqtt://***@h:1");
        assert_eq!(redact_url("mqtt://h:1"), "mqtt://h:1");
    }
}
