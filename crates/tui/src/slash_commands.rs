//! The `/` commands of the input box, their parsing, their completion, and `/help`.

/// A `/` command the user typed.
#[derive(Debug, Clone, PartialEq)]
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
    /// `/budget`: the session's spend and limits, or a change to them.
    Budget(BudgetCommand),
    /// `/compact`: summarise the session's older history now (`session.compact`).
    Compact,
    /// `/quit`: leave (the running turn goes on).
    Quit,
    /// `/help`: the commands and keys.
    Help,
}

/// What `/budget` asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum BudgetCommand {
    /// `/budget`: the spend against the limits (`budget.status`).
    Show,
    /// `/budget +USD` or `/budget +N tokens`: raise the limit by that much. With a turn paused
    /// by a limit, this answers its prompt (`budget.respond` `raise`: the limit it reached);
    /// otherwise it raises the session's limits (`budget.raise`).
    Raise {
        /// USD added.
        usd: Option<f64>,
        /// Tokens added.
        tokens: Option<u64>,
    },
    /// `/budget stop`: end the turn paused by a limit (`budget.respond` `stop`).
    Stop,
}

/// A command as `/help` and completion show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandHelp {
    /// What is typed: `/resume`.
    pub name: &'static str,
    /// The `/help` group it is listed in.
    pub group: &'static str,
    /// Its forms as typed, each with what it does; the first is the one completion shows.
    pub forms: &'static [(&'static str, &'static str)],
}

/// Every command, in completion order (and in `/help`'s order within a group).
pub const COMMANDS: &[CommandHelp] = &[
    CommandHelp {
        name: "/new",
        group: THIS_HOME,
        forms: &[("/new", "start a new session")],
    },
    CommandHelp {
        name: "/sessions",
        group: THIS_HOME,
        forms: &[("/sessions", "list this home's sessions")],
    },
    CommandHelp {
        name: "/resume",
        group: THIS_HOME,
        forms: &[("/resume <id|prefix>", "switch to another session")],
    },
    CommandHelp {
        name: "/title",
        group: THIS_SESSION,
        forms: &[("/title <text>", "name this session")],
    },
    CommandHelp {
        name: "/usage",
        group: THIS_SESSION,
        forms: &[("/usage", "tokens (and cost) this session used")],
    },
    CommandHelp {
        name: "/budget",
        group: THIS_SESSION,
        forms: &[
            ("/budget", "spend against the limits"),
            (
                "/budget +USD",
                "raise the USD limit (a paused turn goes on)",
            ),
            ("/budget +N tokens", "raise the token limit"),
            ("/budget stop", "end the turn paused by a limit"),
        ],
    },
    CommandHelp {
        name: "/compact",
        group: THIS_SESSION,
        forms: &[("/compact", "summarise the older history now")],
    },
    CommandHelp {
        name: "/approvals",
        group: THIS_HOME,
        forms: &[("/approvals", "list the stored `always` rules")],
    },
    CommandHelp {
        name: "/quit",
        group: THE_CHAT,
        forms: &[("/quit", "leave (a running turn goes on)")],
    },
    CommandHelp {
        name: "/help",
        group: THE_CHAT,
        forms: &[("/help", "these commands and keys")],
    },
];

const THIS_SESSION: &str = "this session";
const THIS_HOME: &str = "this home";
const THE_CHAT: &str = "the chat";
/// `/help`'s groups, in order.
const GROUPS: [&str; 3] = [THIS_SESSION, THIS_HOME, THE_CHAT];

/// The keys, as `/help` lists them.
pub const KEYS: &[(&str, &str)] = &[
    ("Enter", "send (queued behind a running turn)"),
    ("Alt+Enter, Ctrl-J", "new line"),
    ("↑ / ↓", "input history"),
    ("Tab", "complete a command"),
    ("Esc", "clear the input"),
    ("Ctrl-C", "interrupt the turn; twice: leave"),
    ("Ctrl-D", "leave (a running turn goes on)"),
];

/// `/help`'s lines: the commands by group, then the keys, in two aligned columns (each line
/// fits 80 columns with the notice's two-column mark).
pub fn help_lines() -> Vec<String> {
    let forms = COMMANDS.iter().flat_map(|c| c.forms.iter());
    let width = forms
        .chain(KEYS.iter())
        .map(|(form, _)| form.chars().count())
        .max()
        .unwrap_or(0);
    let row = |form: &str, what: &str| {
        let pad = width - form.chars().count();
        format!("  {form}{}  {what}", " ".repeat(pad))
    };
    let mut lines = Vec::new();
    for group in GROUPS {
        lines.push(format!("{group}:"));
        for c in COMMANDS.iter().filter(|c| c.group == group) {
            lines.extend(c.forms.iter().map(|(form, what)| row(form, what)));
        }
    }
    lines.push("keys:".to_string());
    lines.extend(KEYS.iter().map(|(key, what)| row(key, what)));
    lines
}

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
        "/budget" => Command::Budget(parse_budget(rest)?),
        "/compact" => Command::Compact,
        "/quit" | "/exit" => Command::Quit,
        "/help" => Command::Help,
        other => {
            return Err(format!(
                "unknown command {other}; the commands are {}",
                COMMANDS
                    .iter()
                    .map(|c| c.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        }
    };
    Ok(command)
}

/// `/budget`'s argument: nothing, `stop`, `+USD` (`+2`, `+$2.50`, `+2 usd`) or `+N tokens`.
fn parse_budget(rest: &str) -> Result<BudgetCommand, String> {
    const FORMS: &str = "/budget takes nothing, +USD (as /budget +2), +N tokens, or stop";
    if rest.is_empty() {
        return Ok(BudgetCommand::Show);
    }
    if rest.eq_ignore_ascii_case("stop") {
        return Ok(BudgetCommand::Stop);
    }
    let Some(amount) = rest.strip_prefix('+') else {
        return Err(format!("{FORMS}: a limit is raised by an amount, not set"));
    };
    let amount = amount.trim().to_ascii_lowercase();
    let tokens = ["tokens", "token"]
        .iter()
        .find_map(|unit| amount.strip_suffix(unit));
    if let Some(n) = tokens {
        let n = n.trim().replace('_', "");
        return match n.parse::<u64>() {
            Ok(n) if n > 0 => Ok(BudgetCommand::Raise {
                usd: None,
                tokens: Some(n),
            }),
            _ => Err(format!(
                "{FORMS}: {n:?} is not a whole number of tokens over 0"
            )),
        };
    }
    let usd = amount.strip_suffix("usd").unwrap_or(&amount).trim();
    let usd = usd.strip_prefix('$').unwrap_or(usd).trim();
    match usd.parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok(BudgetCommand::Raise {
            usd: Some(x),
            tokens: None,
        }),
        _ => Err(format!("{FORMS}: {usd:?} is not an amount of USD over 0")),
    }
}

/// The commands whose name starts with what is typed (only while the first word is typed),
/// each as its first form and what it does.
pub fn completions(typed: &str) -> Vec<(&'static str, &'static str)> {
    if !typed.starts_with('/') || typed.contains(char::is_whitespace) {
        return Vec::new();
    }
    COMMANDS
        .iter()
        .filter(|c| c.name.starts_with(typed))
        .filter_map(|c| c.forms.first().copied())
        .collect()
}

/// Tab: the completed text when exactly one command matches (with a space if it needs an
/// argument), else the matches' common prefix.
pub fn complete(typed: &str) -> Option<String> {
    if !typed.starts_with('/') || typed.contains(char::is_whitespace) {
        return None;
    }
    let matches: Vec<&CommandHelp> = COMMANDS
        .iter()
        .filter(|c| c.name.starts_with(typed))
        .collect();
    match matches.as_slice() {
        [] => None,
        [only] => Some(match only.forms.first() {
            Some((form, _)) if form.contains(" <") => format!("{} ", only.name),
            _ => only.name.to_string(),
        }),
        [first, rest @ ..] => {
            let mut prefix = first.name.to_string();
            for c in rest {
                while !c.name.starts_with(&prefix) {
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
    fn budget_reads_an_amount_of_usd_or_tokens_or_stop() {
        let usd = |x| {
            Ok(Command::Budget(BudgetCommand::Raise {
                usd: Some(x),
                tokens: None,
            }))
        };
        assert_eq!(parse("/budget"), Ok(Command::Budget(BudgetCommand::Show)));
        assert_eq!(parse("/budget +2"), usd(2.0));
        assert_eq!(parse("/budget +$2.50"), usd(2.5));
        assert_eq!(parse("/budget + 1 USD"), usd(1.0));
        assert_eq!(
            parse("/budget +5000 tokens"),
            Ok(Command::Budget(BudgetCommand::Raise {
                usd: None,
                tokens: Some(5000),
            }))
        );
        assert_eq!(
            parse("/budget STOP"),
            Ok(Command::Budget(BudgetCommand::Stop))
        );
        assert!(parse("/budget 5").unwrap_err().contains("not set"));
        assert!(parse("/budget +0").unwrap_err().contains("over 0"));
        assert!(parse("/budget +1.5 tokens")
            .unwrap_err()
            .contains("whole number"));
        assert!(parse("/budget +lots").unwrap_err().contains("+USD"));
    }

    #[test]
    fn tab_completes_a_unique_prefix() {
        assert_eq!(complete("/re").as_deref(), Some("/resume "));
        assert_eq!(complete("/q").as_deref(), Some("/quit"));
        assert_eq!(complete("/co").as_deref(), Some("/compact"));
        assert_eq!(complete("/b").as_deref(), Some("/budget"));
        assert_eq!(complete("/x"), None);
        assert_eq!(completions("/").len(), COMMANDS.len());
        assert!(completions("/resume x").is_empty());
    }

    /// Two aligned columns, every command and key listed, each line within 80 columns once
    /// the notice's mark (`· `) is put before it.
    #[test]
    fn help_is_two_aligned_columns_within_80_columns() {
        let lines = help_lines();
        insta::assert_snapshot!(lines.join("\n"));
        for line in &lines {
            assert!(line.chars().count() + 2 <= 80, "{line:?}");
        }
        for c in COMMANDS {
            assert!(lines.iter().any(|l| l.trim_start().starts_with(c.name)));
        }
        // The second column starts at the same place on every row: after the widest form.
        let widest = COMMANDS
            .iter()
            .flat_map(|c| c.forms.iter())
            .chain(KEYS.iter())
            .map(|(form, _)| form.chars().count())
            .max()
            .unwrap();
        let start = 2 + widest + 2;
        for row in lines.iter().filter(|l| l.starts_with("  ")) {
            let row: Vec<char> = row.chars().collect();
            assert!(row[start] != ' ' && row[start - 1] == ' ', "{row:?}");
        }
    }
}
