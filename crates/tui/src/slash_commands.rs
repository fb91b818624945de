//! The `/` commands of the input box, their parsing and their completion.

/// A `/` command the user typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `/new`: start a new session.
    New,
    /// `/sessions`: list this home's sessions.
    Sessions,
    /// `/resume <id|prefix>`: switch to another session.
    Resume(String),
    /// `/title <text>`: name this session.
    Title(String),
    /// `/approvals`: list the stored `always` rules.
    Approvals,
    /// `/usage`: the tokens this session used.
    Usage,
    /// `/compact`: summarise the session's older history now (`session.compact`).
    Compact,
    /// `/quit`: leave (the running turn goes on).
    Quit,
    /// `/help`: the commands and keys.
    Help,
}

/// Every command with its one-line help, in completion order.
pub const COMMANDS: &[(&str, &str)] = &[
    ("/new", "start a new session"),
    ("/sessions", "list this home's sessions"),
    ("/resume", "<id|prefix>  switch to another session"),
    ("/title", "<text>  name this session"),
    ("/approvals", "list the stored `always` rules"),
    ("/usage", "tokens used by this session"),
    (
        "/compact",
        "summarise the older history now (the transcript keeps it)",
    ),
    ("/quit", "leave (a running turn goes on)"),
    ("/help", "commands and keys"),
];

/// Parses a line starting with `/`. `Err` says what is wrong, for the user.
pub fn parse(line: &str) -> Result<Command, String> {
    let line = line.trim();
    let (name, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
    let rest = rest.trim();
    let command = match name {
        "/new" => Command::New,
        "/sessions" => Command::Sessions,
        "/resume" if rest.is_empty() => {
            return Err("/resume needs a session id or prefix (see /sessions)".to_string())
        }
        "/resume" => Command::Resume(rest.to_string()),
        "/title" if rest.is_empty() => return Err("/title needs the new title".to_string()),
        "/title" => Command::Title(rest.to_string()),
        "/approvals" => Command::Approvals,
        "/usage" => Command::Usage,
        "/compact" => Command::Compact,
        "/quit" | "/exit" => Command::Quit,
        "/help" => Command::Help,
        other => {
            return Err(format!(
                "unknown command {other}; the commands are {}",
                COMMANDS
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        }
    };
    Ok(command)
}

/// The commands whose name starts with what is typed (only while the first word is typed).
pub fn completions(typed: &str) -> Vec<(&'static str, &'static str)> {
    if !typed.starts_with('/') || typed.contains(char::is_whitespace) {
        return Vec::new();
    }
    COMMANDS
        .iter()
        .filter(|(name, _)| name.starts_with(typed))
        .copied()
        .collect()
}

/// Tab: the completed text when exactly one command matches (with a space if it takes an
/// argument), else the matches' common prefix.
pub fn complete(typed: &str) -> Option<String> {
    let matches = completions(typed);
    match matches.as_slice() {
        [] => None,
        [(name, help)] => Some(if help.starts_with('<') {
            format!("{name} ")
        } else {
            name.to_string()
        }),
        [(first, _), rest @ ..] => {
            let mut prefix = first.to_string();
            for (name, _) in rest {
                while !name.starts_with(&prefix) {
                    prefix.pop();
                }
            }
            (prefix.len() > typed.len()).then_some(prefix)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_reads_arguments_and_refuses_unknown_commands() {
        assert_eq!(parse("/resume  ab12 "), Ok(Command::Resume("ab12".into())));
        assert_eq!(
            parse("/title my work"),
            Ok(Command::Title("my work".into()))
        );
        assert!(parse("/resume").unwrap_err().contains("id or prefix"));
        assert!(parse("/frobnicate").unwrap_err().contains("/new"));
        assert_eq!(parse(" /compact "), Ok(Command::Compact));
    }

    #[test]
    fn tab_completes_a_unique_prefix() {
        assert_eq!(complete("/re").as_deref(), Some("/resume "));
        assert_eq!(complete("/q").as_deref(), Some("/quit"));
        assert_eq!(complete("/co").as_deref(), Some("/compact"));
        assert_eq!(complete("/x"), None);
        assert_eq!(completions("/").len(), COMMANDS.len());
        assert!(completions("/resume x").is_empty());
    }
}
