//! [`Secret`]: a string that must never reach a log: the execution secret, the
//! bearer token, API keys, MCP server environment values.
//!
//! `Debug` and `Display` print `[redacted]`, so a `?policy` in a log line or a `{}` in an
//! error message shows nothing; serde is transparent, so the wire bytes are those of the plain
//! string. Reading the value takes an explicit [`Secret::expose`], easy to find in review.

use std::borrow::Cow;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

/// What `Debug` and `Display` print instead of a secret.
pub const REDACTED: &str = "[redacted]";

/// A secret string. Serialises as the plain string; prints as [`REDACTED`].
#[derive(Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps `value`.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The secret itself: only where it is used (a header, a digest, a child's environment).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether the secret is the empty string.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Secret {
        Secret(value)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Secret {
        Secret(value.to_string())
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl JsonSchema for Secret {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        String::schema_name()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        String::json_schema(generator)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_redacted_and_serialises_as_the_plain_string() {
        let secret = Secret::new("hunter2");
        assert_eq!(format!("{secret:?}"), REDACTED);
        assert_eq!(format!("{secret}"), REDACTED);
        assert_eq!(format!("{:?}", Some(&secret)), "Some([redacted])");
        assert_eq!(serde_json::to_string(&secret).expect("json"), "\"hunter2\"");
        let back: Secret = serde_json::from_str("\"hunter2\"").expect("parse");
        assert_eq!(back.expose(), "hunter2");
        assert_eq!(
            serde_json::to_value(schemars::schema_for!(Secret)).expect("schema")["type"],
            "string"
        );
    }
}
