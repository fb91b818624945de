//! Confinement of tool processes (`docs/sandbox.md`): the `[sandbox]` mode, the
//! policy the owner freezes per session and sends to the worker in its bootstrap frame, and
//! `session.resume`'s `info.confinement`, which says what is really in force.
//!
//! Two layers, both applied in every tool process before it runs its command:
//! - **the homes are out of reach** (every mode but `off`): a new user and mount namespace in
//!   which each path of [`SandboxPolicy::hidden`] (every drover home, the browsers' profiles)
//!   is covered by an empty read-only mount, so no token, ledger, config or key file of
//!   drover's, and no dashboard login, can be read;
//! - **the Landlock sandbox** ([`SandboxMode`]): reads anywhere, writes only under
//!   [`SandboxPolicy::writable_roots`], TCP optionally refused.

use std::fmt;
use std::str::FromStr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::policy::ParseError;

/// `[sandbox] mode` in `config.toml`, frozen per session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", try_from = "String")]
pub enum SandboxMode {
    /// Reads anywhere; writes under the session cwd, the temp dir and `writable_roots` (the
    /// default).
    #[default]
    WorkspaceWrite,
    /// Reads anywhere; writes nowhere but a few devices (`/dev/null` and the like).
    ReadOnly,
    /// No confinement at all: tools run as the user, as before the sandbox work.
    Off,
}

impl SandboxMode {
    /// Every mode, in the order the docs list them.
    pub const ALL: [SandboxMode; 3] = [
        SandboxMode::WorkspaceWrite,
        SandboxMode::ReadOnly,
        SandboxMode::Off,
    ];

    /// The config and wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxMode::WorkspaceWrite => "workspace-write",
            SandboxMode::ReadOnly => "read-only",
            SandboxMode::Off => "off",
        }
    }
}

impl fmt::Display for SandboxMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SandboxMode {
    type Err = ParseError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        SandboxMode::ALL
            .into_iter()
            .find(|mode| mode.as_str() == value)
            .ok_or_else(|| ParseError {
                field: "sandbox.mode",
                value: value.to_string(),
                expected: "workspace-write, read-only, off",
            })
    }
}

impl TryFrom<String> for SandboxMode {
    type Error = ParseError;

    fn try_from(value: String) -> Result<Self, Self::Error> {
        value.parse()
    }
}

/// What the owner found the kernel can do, probed once at daemon start.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SandboxSupport {
    /// A process can make a new user and mount namespace (unprivileged user namespaces are
    /// allowed).
    pub namespaces: bool,
    /// The Landlock ABI version the kernel offers; `None` without Landlock.
    pub landlock_abi: Option<u32>,
    /// Why a layer is missing, for the log and `info.confinement` (empty when both work).
    #[serde(default)]
    pub problems: Vec<String>,
}

/// The confinement a worker applies to every tool process of its turn (bootstrap frame,
/// `policy.sandbox`). The owner builds it from the session's frozen `[sandbox]` settings and
/// the probed [`SandboxSupport`]; the worker adds nothing but its own temp dir.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxPolicy {
    /// The session's frozen mode.
    pub mode: SandboxMode,
    /// Absolute directories a tool may write under: the session cwd first, then
    /// `[sandbox] writable_roots`. The worker adds the temp dir. Unused in `read-only`.
    pub writable_roots: Vec<String>,
    /// `[sandbox] network`: false refuses TCP connect and bind (Landlock ABI 4 and later).
    pub network: bool,
    /// Absolute paths hidden behind an empty read-only mount in every tool process (the
    /// session's drover home first, then every home of the user's list, the default home and
    /// the browsers' profiles). Empty in `off`.
    pub hidden: Vec<String>,
    /// `[sandbox] required`: refuse to run a tool when a layer cannot be applied, rather than
    /// run it with less.
    pub required: bool,
    /// What the kernel can do (the owner's probe).
    pub support: SandboxSupport,
    /// `[sandbox.env]`: how the environment of every tool process is cut down (applied in
    /// every mode, `off` included).
    #[serde(default)]
    pub env: ToolEnv,
}

/// `[sandbox.env]`, read at each turn from the daemon's config (it may hold values the user
/// wants tools to have, so it is not stored in the ledger). The worker starts each tool with
/// its own environment minus every `DROVER_*` variable and every variable whose name contains
/// `KEY`, `SECRET`, `TOKEN`, `PASSWORD` or `CREDENTIAL` (any case), except the names in `keep`;
/// then it adds `set`.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolEnv {
    /// Names kept although they match the removal rule.
    #[serde(default)]
    pub keep: Vec<String>,
    /// Variables set for every tool process, after the removal.
    #[serde(default)]
    pub set: std::collections::BTreeMap<String, String>,
}

impl fmt::Debug for ToolEnv {
    /// The names only: a `set` value may be a secret the user hands to tools.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolEnv")
            .field("keep", &self.keep)
            .field("set", &self.set.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Default for SandboxPolicy {
    /// `off`: what a worker does when the owner sent no policy (an older owner).
    fn default() -> Self {
        SandboxPolicy {
            mode: SandboxMode::Off,
            writable_roots: Vec::new(),
            network: true,
            hidden: Vec::new(),
            required: false,
            support: SandboxSupport::default(),
            env: ToolEnv::default(),
        }
    }
}

/// `session.resume`'s `info.confinement`: what is in force for the session's tools, never
/// more than is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Confinement {
    /// `workspace-write`, `read-only` or `off` as frozen; `unavailable` when the mode asks for
    /// Landlock and the kernel has none (tools then run without the write rules, or not at all
    /// when `required`).
    pub sandbox: String,
    /// Whether drover's homes and the browsers' profiles are hidden from tools (a user and
    /// mount namespace per tool process).
    pub home_hidden: bool,
    /// The Landlock ABI in use, if any (6 and later also scope signals and abstract unix
    /// sockets to the tool's own processes).
    pub landlock_abi: Option<u32>,
    /// `open`; `blocked` (a network namespace with only the tool's own loopback: no TCP, MPTCP,
    /// UDP, DNS or abstract unix socket reaches out; pathname unix sockets stay reachable, as
    /// `problems` says); `tcp_refused` (no user namespaces: Landlock refuses TCP only); or
    /// `not_enforced` (`network = false` asked, the kernel can refuse nothing).
    pub network: String,
    /// Where tools may write (empty in `read-only` and when nothing is enforced).
    pub writable_roots: Vec<String>,
    /// `[sandbox] required` as frozen: tools are refused rather than run with less.
    pub required: bool,
    /// Why something asked for is not in force, and what an enforced layer still leaves open.
    #[serde(default)]
    pub problems: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_round_trip_and_a_wrong_one_names_the_field() {
        for mode in SandboxMode::ALL {
            let text = serde_json::to_string(&mode).expect("serialize");
            assert_eq!(text, format!("\"{mode}\""));
            let back: SandboxMode = serde_json::from_str(&text).expect("parse");
            assert_eq!(back, mode);
        }
        let err = serde_json::from_str::<SandboxMode>("\"yes\"").expect_err("refused");
        assert!(err.to_string().contains("sandbox.mode"), "{err}");
    }

    #[test]
    fn the_default_policy_confines_nothing() {
        let policy = SandboxPolicy::default();
        assert_eq!(policy.mode, SandboxMode::Off);
        assert!(policy.hidden.is_empty());
    }
}
