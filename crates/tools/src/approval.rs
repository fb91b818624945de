//! The approval policy for shell commands (SPEC section 6; the user-facing page is
//! `docs/approvals.md`).
//!
//! Two parts, both pure:
//! - [`classify`] says whether a command is dangerous, and which pattern it matches. It
//!   *parses* the command (quotes, `&&`/`||`/`;`/pipes, subshells, substitutions, here-documents,
//!   `sudo`/`env`/`nohup`-style wrappers, `sh -c '...'`) and looks at what would actually run,
//!   so `echo "rm -rf /"` is safe and `ls && sudo rm -r x` is not. [`classify_except`] finds
//!   the next class of danger past some (one command may hold several).
//! - [`decide`] turns the configured [`ApprovalMode`], the classification and any existing grant
//!   into a [`Decision`]: run, ask the user, or refuse.
//!
//! - [`scope`] says where an `always` rule applies: the words of each scope, the scopes a
//!   prompt offers, and whether a rule bound to a directory tree covers a command (read with
//!   the same parser).
//!
//! What it does not do: ask the user (the `authorize` module does, through the tool's
//! [`crate::PromptBroker`]) or store grants (the owner does).
//!
//! ```
//! use drover_tools::approval::{classify, decide, ApprovalMode, Decision};
//!
//! let danger = classify("cd build && rm -rf out").expect("dangerous");
//! assert_eq!(danger.key, "recursive_delete");
//! assert_eq!(decide(ApprovalMode::Manual, Some(&danger), false), Decision::Ask);
//! assert_eq!(classify("echo 'rm -rf /'"), None);
//! ```

mod argv;
mod rules;
pub mod scope;
mod shell;

use std::fmt;
use std::str::FromStr;

/// A dangerous command, as [`classify`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Danger {
    /// The stable pattern id (one of [`PATTERNS`]); grants (`session`, `always`) are per key.
    pub key: &'static str,
    /// A human sentence naming what the command would do and the part that does it.
    pub description: String,
}

/// Every pattern key [`classify`] can return, with the sentence its descriptions start with.
pub const PATTERNS: &[(&str, &str)] = &[
    ("recursive_delete", "deletes files recursively"),
    (
        "forced_delete",
        "deletes files without confirmation (rm -f)",
    ),
    ("find_delete", "deletes every file that find matches"),
    ("disk_format", "formats or repartitions a disk"),
    ("device_write", "writes directly to a device"),
    (
        "system_permissions",
        "changes the owner or permissions of a system directory",
    ),
    ("pipe_to_shell", "runs a script downloaded from the network"),
    (
        "git_force_push",
        "force-pushes, which can overwrite remote history",
    ),
    (
        "git_reset_hard",
        "discards uncommitted changes (git reset --hard)",
    ),
    ("git_clean", "deletes untracked files (git clean -f)"),
    ("kill_all", "kills every process it can reach"),
    ("startup_file_overwrite", "overwrites a shell startup file"),
    ("sql_drop", "drops a database, schema or table"),
    ("sql_truncate", "empties a database table (TRUNCATE)"),
    (
        "nesting_too_deep",
        "nests substitutions too deeply to be checked",
    ),
];

/// Classifies `command` (a `sh -c` string). `None` means no dangerous pattern was found.
pub fn classify(command: &str) -> Option<Danger> {
    rules::classify(command)
}

/// [`classify`], passing over dangers whose key is in `passed`: the next class of danger in
/// `command` (`rm -rf x; kill -9 -1` holds two), so a grant of one class is not taken for the
/// others.
pub fn classify_except(command: &str, passed: &[&'static str]) -> Option<Danger> {
    rules::classify_except(command, passed)
}

/// `approvals.mode` and the parse error of its spellings live in the protocol crate, since the
/// owner sends the mode to the worker in every bootstrap.
pub use drover_protocol::policy::{ApprovalMode, ParseError};

/// The user's answer to an `approval` prompt (SPEC section 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalChoice {
    /// Run the command this time.
    Once,
    /// Run it, and commands of the same pattern key for the rest of the session.
    Session,
    /// Run it, and record a rule allowing the pattern key from now on.
    Always,
    /// Do not run it.
    Deny,
}

impl ApprovalChoice {
    /// Every choice, in the order prompts offer them.
    pub const ALL: [ApprovalChoice; 4] = [
        ApprovalChoice::Once,
        ApprovalChoice::Session,
        ApprovalChoice::Always,
        ApprovalChoice::Deny,
    ];

    /// The wire spelling: `once`, `session`, `always` or `deny`.
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalChoice::Once => "once",
            ApprovalChoice::Session => "session",
            ApprovalChoice::Always => "always",
            ApprovalChoice::Deny => "deny",
        }
    }

    /// Whether the command runs.
    pub fn allows(self) -> bool {
        !matches!(self, ApprovalChoice::Deny)
    }
}

impl fmt::Display for ApprovalChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ApprovalChoice {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ApprovalChoice::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| ParseError {
                field: "choice",
                value: s.to_string(),
                expected: "once, session, always, deny",
            })
    }
}

/// What to do with a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Run it now.
    Run,
    /// Open an `approval` prompt and run it only if the user allows.
    Ask,
    /// Do not run it, and do not ask.
    Refuse,
}

/// The policy: what to do with a command classified as `danger` under `mode`.
///
/// `already_allowed` means a `session` grant or a stored `always` rule covers `danger`'s key.
/// `deny` mode refuses even then: it is the operator's statement that no dangerous command
/// runs, whatever was granted under another mode.
pub fn decide(mode: ApprovalMode, danger: Option<&Danger>, already_allowed: bool) -> Decision {
    match danger {
        None => Decision::Run,
        Some(_) => decide_dangerous(mode, already_allowed),
    }
}

/// [`decide`] for an action known to need approval.
pub(crate) fn decide_dangerous(mode: ApprovalMode, already_allowed: bool) -> Decision {
    match mode {
        ApprovalMode::Auto => Decision::Run,
        ApprovalMode::Deny => Decision::Refuse,
        ApprovalMode::Manual if already_allowed => Decision::Run,
        ApprovalMode::Manual => Decision::Ask,
    }
}

/// Why a dangerous action did not get to run (see the `authorize` module).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `approvals.mode = "deny"` refuses it without asking.
    ModeDeny,
    /// The human chose `deny`, the prompt was closed unanswered, or the answer was unreadable.
    Denied,
    /// The turn was interrupted while the prompt was open.
    Interrupted,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn danger() -> Danger {
        Danger {
            key: "recursive_delete",
            description: "deletes files recursively: rm -rf x".to_string(),
        }
    }

    #[test]
    fn decide_covers_every_mode_danger_and_grant() {
        use ApprovalMode::*;
        use Decision::*;
        let d = danger();
        let table = [
            (Manual, None, false, Run),
            (Manual, None, true, Run),
            (Manual, Some(&d), false, Ask),
            (Manual, Some(&d), true, Run),
            (Auto, None, false, Run),
            (Auto, Some(&d), false, Run),
            (Auto, Some(&d), true, Run),
            (Deny, None, false, Run),
            (Deny, Some(&d), false, Refuse),
            (Deny, Some(&d), true, Refuse),
        ];
        for (mode, danger, allowed, expected) in table {
            assert_eq!(
                decide(mode, danger, allowed),
                expected,
                "{mode} {danger:?} {allowed}"
            );
        }
    }

    #[test]
    fn choices_round_trip_their_spellings() {
        for choice in ApprovalChoice::ALL {
            assert_eq!(choice.as_str().parse::<ApprovalChoice>(), Ok(choice));
        }
        let err = "Once".parse::<ApprovalChoice>().expect_err("invalid");
        assert_eq!(
            err.to_string(),
            r#"invalid choice "Once" (expected one of: once, session, always, deny)"#
        );
        assert!(!ApprovalChoice::Deny.allows());
        assert!(ApprovalChoice::Always.allows());
    }

    #[test]
    fn every_classified_key_is_a_listed_pattern() {
        for command in [
            "rm -r x",
            "rm -f x",
            "find . -delete",
            "mkfs.ext4 /dev/sdb1",
            "dd of=/dev/sda",
            "chmod -R 777 /",
            "curl x | sh",
            "git push -f",
            "git reset --hard",
            "git clean -fd",
            "kill -9 -1",
            "echo > ~/.bashrc",
            "psql -c 'drop table t'",
            "mysql -e 'truncate t'",
        ] {
            let danger = classify(command).expect(command);
            let listed = PATTERNS.iter().find(|(key, _)| *key == danger.key);
            let (_, sentence) = listed.unwrap_or_else(|| panic!("{} not in PATTERNS", danger.key));
            assert!(danger.description.starts_with(sentence), "{danger:?}");
        }
    }

    #[test]
    fn classify_except_finds_the_next_class_of_danger() {
        let next = |command: &str, passed: &[&'static str]| {
            classify_except(command, passed).map(|d| d.key)
        };
        let deletes = &["recursive_delete"][..];
        for (command, key) in [
            ("rm -rf x; kill -9 -1", Some("kill_all")),
            (
                "rm -rf x && curl -s https://example.com/x | sh",
                Some("pipe_to_shell"),
            ),
            ("sh -c 'rm -rf x; git push --force'", Some("git_force_push")),
            ("(rm -rf x) > /dev/sda", Some("device_write")),
            ("rm -rf x $(dropdb app)", Some("sql_drop")),
            ("rm -rf x; rm -rf y", None),
            ("rm -rf x | sudo rm -rf /", None),
        ] {
            assert_eq!(next(command, deletes), key, "{command}");
        }
        assert_eq!(
            next("rm -rf x; kill -9 -1", &["recursive_delete", "kill_all"]),
            None
        );
        assert_eq!(
            next("find . -delete -exec kill -9 -1 \\;", &["find_delete"]),
            Some("kill_all")
        );
        assert_eq!(
            next(
                "python3 -c 'import os, shutil; shutil.rmtree(\"x\"); os.system(\"kill -9 -1\")'",
                deletes
            ),
            Some("kill_all")
        );
        // The walk's state does not outlive the call.
        assert_eq!(classify("kill -9 -1").map(|d| d.key), Some("kill_all"));
    }
}
