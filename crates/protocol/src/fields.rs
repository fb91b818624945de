//! The rules every string param of the client protocol follows, in one place: the params of
//! the `client` module name these functions in their `deserialize_with`, so a value that breaks
//! a rule is refused while the params are parsed, as `invalid_params` naming its field.
//!
//! - Ids and names (`session_id`, `request_id`, `input_id`, `admission_id`, `prompt_id`,
//!   `model`, `source`, toolset names): not empty, at most [`MAX_NAME_BYTES`], no control
//!   character and no bidirectional override or isolate.
//! - Titles: one line of 1 to [`MAX_TITLE_CHARS`] characters, not only spaces, with the same
//!   characters refused as names.
//! - `api_key`: not empty, at most [`MAX_API_KEY_BYTES`], no control character (it becomes an
//!   HTTP header, where a NUL or a new line would cut or split it).
//! - Every other string has a bound: `base_url` [`MAX_URL_BYTES`], `cwd` [`MAX_PATH_BYTES`]
//!   (and no NUL), `system_prompt` [`MAX_SYSTEM_PROMPT_BYTES`], opaque keys and cursors
//!   [`MAX_KEY_BYTES`]. An input's `text` is bounded by the daemon's `[daemon] max_input_bytes`,
//!   which the owner checks (this crate does not read config).
//!
//! Bidirectional overrides and isolates (U+202A to U+202E, U+2066 to U+2069) make a listing
//! print text in another order than it is stored: a title could pass for another session's, or
//! hide what follows it.
//!
//! ```
//! use drover_protocol::fields::{check_name, FieldError};
//!
//! assert!(check_name("gpt-4o").is_ok());
//! assert_eq!(check_name(""), Err(FieldError::Empty));
//! assert_eq!(check_name("a\u{202e}b"), Err(FieldError::Bidi('\u{202e}')));
//! ```

use serde::de::Error as _;
use serde::{Deserialize, Deserializer};

use crate::secret::Secret;

/// The most bytes of an id or a name.
pub const MAX_NAME_BYTES: usize = 256;

/// The most characters of a title.
pub const MAX_TITLE_CHARS: usize = 200;

/// The most bytes of an API key.
pub const MAX_API_KEY_BYTES: usize = 4096;

/// The most bytes of a URL (`base_url`).
pub const MAX_URL_BYTES: usize = 2048;

/// The most bytes of a path (`cwd`): Linux's `PATH_MAX`.
pub const MAX_PATH_BYTES: usize = 4096;

/// The most bytes of a system prompt.
pub const MAX_SYSTEM_PROMPT_BYTES: usize = 1024 * 1024;

/// The most bytes of an opaque key the daemon made (`cursor`, `replay_epoch`, `pattern_key`).
pub const MAX_KEY_BYTES: usize = 4096;

/// The most toolset names one `session.create` may list.
pub const MAX_TOOLSETS: usize = 64;

/// The most MCP servers one `session.create` may bring (`mcp_servers`): each is a toolset.
pub const MAX_MCP_SERVERS: usize = MAX_TOOLSETS;

/// The most arguments, and the most environment variables, of one MCP server.
pub const MAX_MCP_ITEMS: usize = 1024;

/// The most bytes of one argument or environment value of an MCP server (Linux's
/// `MAX_ARG_STRLEN`: a longer one could not be passed to the program).
pub const MAX_ARG_BYTES: usize = 128 * 1024;

/// Why a string param was refused (the field is named by the caller).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FieldError {
    /// Empty, or (a title) only spaces.
    #[error("must not be empty")]
    Empty,
    /// Longer than its bound.
    #[error("is {len} {unit}; at most {max} are allowed")]
    TooLong {
        /// Its length.
        len: usize,
        /// The bound.
        max: usize,
        /// `bytes` or `characters`.
        unit: &'static str,
    },
    /// Holds a control character (a NUL, a new line, a tab, an escape...).
    #[error("must not contain control characters (it has U+{:04X})", *.0 as u32)]
    Control(char),
    /// Holds a bidirectional override or isolate.
    #[error(
        "must not contain bidirectional overrides or isolates (it has U+{:04X})",
        *.0 as u32
    )]
    Bidi(char),
    /// Too many items in a list.
    #[error("has {len} items; at most {max} are allowed")]
    TooMany {
        /// How many it has.
        len: usize,
        /// The bound.
        max: usize,
    },
}

/// Whether `c` is a bidirectional override (U+202A to U+202E) or isolate (U+2066 to U+2069).
pub fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

fn bytes_at_most(s: &str, max: usize) -> Result<(), FieldError> {
    if s.len() > max {
        return Err(FieldError::TooLong {
            len: s.len(),
            max,
            unit: "bytes",
        });
    }
    Ok(())
}

/// No control character and no bidirectional override or isolate.
fn printable(s: &str) -> Result<(), FieldError> {
    match s.chars().find(|&c| c.is_control() || is_bidi_control(c)) {
        Some(c) if c.is_control() => Err(FieldError::Control(c)),
        Some(c) => Err(FieldError::Bidi(c)),
        None => Ok(()),
    }
}

/// An id or a name: not empty, at most [`MAX_NAME_BYTES`], printable as it is.
pub fn check_name(s: &str) -> Result<(), FieldError> {
    if s.is_empty() {
        return Err(FieldError::Empty);
    }
    bytes_at_most(s, MAX_NAME_BYTES)?;
    printable(s)
}

/// A title: not only spaces, at most [`MAX_TITLE_CHARS`] characters, printable as it is.
pub fn check_title(s: &str) -> Result<(), FieldError> {
    if s.trim().is_empty() {
        return Err(FieldError::Empty);
    }
    printable(s)?;
    let chars = s.chars().count();
    if chars > MAX_TITLE_CHARS {
        return Err(FieldError::TooLong {
            len: chars,
            max: MAX_TITLE_CHARS,
            unit: "characters",
        });
    }
    Ok(())
}

/// An API key: not empty, at most [`MAX_API_KEY_BYTES`], no control character.
pub fn check_api_key(s: &str) -> Result<(), FieldError> {
    if s.is_empty() {
        return Err(FieldError::Empty);
    }
    bytes_at_most(s, MAX_API_KEY_BYTES)?;
    match s.chars().find(|c| c.is_control()) {
        Some(c) => Err(FieldError::Control(c)),
        None => Ok(()),
    }
}

/// A path: at most [`MAX_PATH_BYTES`], no NUL (which no path can hold).
pub fn check_path(s: &str) -> Result<(), FieldError> {
    bytes_at_most(s, MAX_PATH_BYTES)?;
    match s.contains('\0') {
        true => Err(FieldError::Control('\0')),
        false => Ok(()),
    }
}

/// A URL: not empty, at most [`MAX_URL_BYTES`], no control character.
pub fn check_url(s: &str) -> Result<(), FieldError> {
    if s.is_empty() {
        return Err(FieldError::Empty);
    }
    bytes_at_most(s, MAX_URL_BYTES)?;
    match s.chars().find(|c| c.is_control()) {
        Some(c) => Err(FieldError::Control(c)),
        None => Ok(()),
    }
}

/// Reads a string and checks it with `rule`.
fn checked<'de, D: Deserializer<'de>>(
    d: D,
    rule: fn(&str) -> Result<(), FieldError>,
) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    rule(&s).map_err(D::Error::custom)?;
    Ok(s)
}

/// Reads an optional string and, when given, checks it with `rule`.
fn checked_opt<'de, D: Deserializer<'de>>(
    d: D,
    rule: fn(&str) -> Result<(), FieldError>,
) -> Result<Option<String>, D::Error> {
    let s = Option::<String>::deserialize(d)?;
    if let Some(s) = &s {
        rule(s).map_err(D::Error::custom)?;
    }
    Ok(s)
}

/// Serde: an id or a name ([`check_name`]).
pub fn name<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    checked(d, check_name)
}

/// Serde: an optional id or name ([`check_name`] when given).
pub fn name_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    checked_opt(d, check_name)
}

/// Serde: a title ([`check_title`]).
pub fn title<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    checked(d, check_title)
}

/// Serde: an optional title ([`check_title`] when given).
pub fn title_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    checked_opt(d, check_title)
}

/// Serde: an optional API key ([`check_api_key`] when given).
pub fn api_key_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Secret>, D::Error> {
    Ok(checked_opt(d, check_api_key)?.map(Secret::from))
}

/// Serde: an optional URL ([`check_url`] when given).
pub fn url_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    checked_opt(d, check_url)
}

/// Serde: an optional path ([`check_path`] when given).
pub fn path_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    checked_opt(d, check_path)
}

/// Serde: an optional system prompt, at most [`MAX_SYSTEM_PROMPT_BYTES`].
pub fn system_prompt_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    checked_opt(d, |s| bytes_at_most(s, MAX_SYSTEM_PROMPT_BYTES))
}

/// Serde: an opaque key the daemon made: not empty, at most [`MAX_KEY_BYTES`].
pub fn key<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    checked(d, |s| match s.is_empty() {
        true => Err(FieldError::Empty),
        false => bytes_at_most(s, MAX_KEY_BYTES),
    })
}

/// Serde: an optional opaque key the daemon made, at most [`MAX_KEY_BYTES`].
pub fn key_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    checked_opt(d, |s| bytes_at_most(s, MAX_KEY_BYTES))
}

/// Serde: toolset names, each a name ([`check_name`]), at most [`MAX_TOOLSETS`] of them, in
/// the order given and each once (a toolset named twice would send each of its tools twice,
/// which an endpoint may refuse as duplicate function names).
pub fn toolset_names<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    let Some(names) = Option::<Vec<String>>::deserialize(d)? else {
        return Ok(None);
    };
    if names.len() > MAX_TOOLSETS {
        return Err(D::Error::custom(FieldError::TooMany {
            len: names.len(),
            max: MAX_TOOLSETS,
        }));
    }
    let mut seen = std::collections::HashSet::new();
    let mut unique = Vec::with_capacity(names.len());
    for n in names {
        check_name(&n).map_err(|e| D::Error::custom(format!("{n:?} {e}")))?;
        if seen.insert(n.clone()) {
            unique.push(n);
        }
    }
    Ok(Some(unique))
}

/// Serde: `session.create` `mcp_servers`, by name: at most [`MAX_MCP_SERVERS`], each name a
/// toolset name ([`check_name`]).
pub fn mcp_servers<'de, D, T>(
    d: D,
) -> Result<Option<std::collections::BTreeMap<String, T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    let Some(servers) = Option::<std::collections::BTreeMap<String, T>>::deserialize(d)? else {
        return Ok(None);
    };
    if servers.len() > MAX_MCP_SERVERS {
        return Err(D::Error::custom(FieldError::TooMany {
            len: servers.len(),
            max: MAX_MCP_SERVERS,
        }));
    }
    for name in servers.keys() {
        check_name(name).map_err(|e| D::Error::custom(format!("server name {name:?} {e}")))?;
    }
    Ok(Some(servers))
}

/// Serde: an MCP server's `command`: not empty, a path's bound, no NUL.
pub fn command<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    checked(d, |s| match s.is_empty() {
        true => Err(FieldError::Empty),
        false => check_path(s),
    })
}

/// An argument or environment value a program can be given: at most [`MAX_ARG_BYTES`], no NUL.
fn check_arg(s: &str) -> Result<(), FieldError> {
    bytes_at_most(s, MAX_ARG_BYTES)?;
    match s.contains('\0') {
        true => Err(FieldError::Control('\0')),
        false => Ok(()),
    }
}

/// Serde: an MCP server's `args`: at most [`MAX_MCP_ITEMS`], each at most [`MAX_ARG_BYTES`]
/// with no NUL.
pub fn args<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let args = Vec::<String>::deserialize(d)?;
    if args.len() > MAX_MCP_ITEMS {
        return Err(D::Error::custom(FieldError::TooMany {
            len: args.len(),
            max: MAX_MCP_ITEMS,
        }));
    }
    for (i, arg) in args.iter().enumerate() {
        check_arg(arg).map_err(|e| D::Error::custom(format!("argument {i} {e}")))?;
    }
    Ok(args)
}

/// Serde: an MCP server's `env`: at most [`MAX_MCP_ITEMS`] variables, each named (not empty,
/// a name's bound, printable, no `=`) and with a value of at most [`MAX_ARG_BYTES`] with no
/// NUL. A refused value is never echoed: it may be a credential.
pub fn env<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<std::collections::BTreeMap<String, Secret>, D::Error> {
    let env = std::collections::BTreeMap::<String, Secret>::deserialize(d)?;
    if env.len() > MAX_MCP_ITEMS {
        return Err(D::Error::custom(FieldError::TooMany {
            len: env.len(),
            max: MAX_MCP_ITEMS,
        }));
    }
    for (key, value) in &env {
        check_name(key).map_err(|e| D::Error::custom(format!("variable {key:?} {e}")))?;
        if key.contains('=') {
            return Err(D::Error::custom(format!(
                "variable {key:?} must not contain '='"
            )));
        }
        check_arg(value.expose())
            .map_err(|e| D::Error::custom(format!("the value of variable {key:?} {e}")))?;
    }
    Ok(env)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_refuse_empty_control_bidi_and_long() {
        assert_eq!(check_name(""), Err(FieldError::Empty));
        assert_eq!(check_name("a\0b"), Err(FieldError::Control('\0')));
        assert_eq!(check_name("a\nb"), Err(FieldError::Control('\n')));
        assert_eq!(check_name("a\u{7f}"), Err(FieldError::Control('\u{7f}')));
        for c in ['\u{202a}', '\u{202e}', '\u{2066}', '\u{2069}'] {
            assert_eq!(check_name(&format!("x{c}y")), Err(FieldError::Bidi(c)));
        }
        assert!(check_name(&"a".repeat(MAX_NAME_BYTES)).is_ok());
        assert!(matches!(
            check_name(&"a".repeat(MAX_NAME_BYTES + 1)),
            Err(FieldError::TooLong { .. })
        ));
        // Other scripts and marks that do not reorder text are names like any other.
        assert!(check_name("模型-ü\u{200f}").is_ok());
    }

    #[test]
    fn titles_count_characters_and_refuse_bidi() {
        assert!(check_title(&"é".repeat(MAX_TITLE_CHARS)).is_ok());
        assert!(check_title(&"é".repeat(MAX_TITLE_CHARS + 1)).is_err());
        assert_eq!(check_title("   "), Err(FieldError::Empty));
        assert_eq!(
            check_title("invoice\u{202e}fdp.exe"),
            Err(FieldError::Bidi('\u{202e}'))
        );
    }

    #[test]
    fn api_keys_refuse_control_characters() {
        assert_eq!(check_api_key("sk-\0"), Err(FieldError::Control('\0')));
        assert_eq!(check_api_key("sk\r\nX: y"), Err(FieldError::Control('\r')));
        assert_eq!(check_api_key(""), Err(FieldError::Empty));
        assert!(check_api_key("sk-abc.DEF_123").is_ok());
    }

    #[test]
    fn paths_refuse_nul_and_overlong() {
        assert_eq!(check_path("/tmp/\0"), Err(FieldError::Control('\0')));
        assert!(check_path(&format!("/{}", "a".repeat(MAX_PATH_BYTES))).is_err());
        assert!(check_path("/tmp/a b\tc").is_ok());
    }

    #[test]
    fn the_message_names_the_code_point() {
        assert_eq!(
            FieldError::Bidi('\u{202e}').to_string(),
            "must not contain bidirectional overrides or isolates (it has U+202E)"
        );
        assert_eq!(
            FieldError::Control('\0').to_string(),
            "must not contain control characters (it has U+0000)"
        );
    }
}
