//! `<home>/config.toml` (SPEC section 1). A missing file means defaults; `$OPENAI_BASE_URL`
//! and `$OPENAI_API_KEY` (or the variable named by `api_key_env`) fill what the file leaves out.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use drover_ledger::SessionSandbox;
use drover_protocol::sandbox::{SandboxMode, ToolEnv};
use drover_protocol::{ApprovalMode, ContextBudget, ModelSettings, Secret};
use serde::Deserialize;

/// The default system prompt of new sessions.
pub const DEFAULT_SYSTEM_PROMPT: &str = "You are drover, a careful coding agent. Use the tools \
to inspect and change the user's workspace, and answer concisely when the task is done.";

/// The whole config file. Unknown keys are refused so typos are caught.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `[model]`: the model endpoint.
    #[serde(default)]
    pub model: ModelSection,
    /// `[approvals]`: what a dangerous command does.
    #[serde(default)]
    pub approvals: ApprovalsSection,
    /// `[toolsets]`: the toolsets of a new session.
    #[serde(default)]
    pub toolsets: ToolsetsSection,
    /// `[delegation]`: the limits on child agents.
    #[serde(default)]
    pub delegation: DelegationSection,
    /// `[mcp_servers.<name>]`: the stdio MCP servers, by name (each is a toolset).
    #[serde(default)]
    pub mcp_servers: BTreeMap<String, McpServer>,
    /// `[daemon]`: the endpoint and stopping.
    #[serde(default)]
    pub daemon: DaemonSection,
    /// `[mqtt]`: the jobs wire.
    #[serde(default)]
    pub mqtt: MqttSection,
    /// `[jobs]`: the runner's dispatch rules.
    #[serde(default)]
    pub jobs: JobsSection,
    /// `[sandbox]`: how tool processes are confined (`docs/sandbox.md`).
    #[serde(default)]
    pub sandbox: SandboxSection,
    /// `[telemetry]` (docs/telemetry.md): read once at daemon start.
    #[serde(default)]
    pub telemetry: TelemetrySection,
}

/// `[model]`. A key left out takes its default: `stream`, `request_timeout_s`, `max_retries`
/// and `stall_timeout_s` those of [`ModelSettings::default`].
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelSection {
    /// The OpenAI-compatible endpoint (`/chat/completions` is appended); `$OPENAI_BASE_URL`
    /// when left out. Frozen per session.
    pub base_url: Option<String>,
    /// The model name sent in every request. Frozen per session.
    pub name: Option<String>,
    /// The variable of the daemon's environment that holds the API key (default
    /// `OPENAI_API_KEY`).
    pub api_key_env: String,
    /// Ask for server-sent events (default true). Frozen per session.
    pub stream: bool,
    /// Seconds one model request may take. Frozen per session.
    pub request_timeout_s: u64,
    /// drover extra: retries after the first attempt (SPEC section 5: bounded).
    pub max_retries: u32,
    /// Seconds a model response may send no byte before it is cancelled and retried; a turn
    /// whose retries all stall fails `model_stalled` (default 120).
    pub stall_timeout_s: u64,
    /// drover extra: model requests per turn at most.
    pub max_steps: u32,
    /// The model's context window in tokens; 0 (the default) asks the endpoint's
    /// `GET /models`, else assumes 128000. Frozen per session.
    pub context_window: u64,
    /// The share of the window a request may fill before older history is compacted
    /// (default 0.8; 0.1 to 1.0). Frozen per session.
    pub compact_at: f64,
    /// Earlier turns a compaction keeps verbatim, beside the running turn (default 2).
    /// Frozen per session.
    pub keep_recent_turns: u32,
}

impl Default for ModelSection {
    fn default() -> Self {
        let settings = ModelSettings::default();
        ModelSection {
            base_url: None,
            name: None,
            api_key_env: "OPENAI_API_KEY".into(),
            stream: settings.stream,
            request_timeout_s: settings.request_timeout_s,
            max_retries: settings.max_retries,
            stall_timeout_s: settings.stall_timeout_s,
            max_steps: 50,
            context_window: 0,
            compact_at: ContextBudget::DEFAULT_COMPACT_AT,
            keep_recent_turns: ContextBudget::DEFAULT_KEEP_RECENT_TURNS,
        }
    }
}

impl ModelSection {
    /// The client settings a new session freezes (SPEC section 4, "Frozen session").
    pub fn settings(&self) -> ModelSettings {
        ModelSettings {
            stream: self.stream,
            request_timeout_s: self.request_timeout_s,
            max_retries: self.max_retries,
            stall_timeout_s: self.stall_timeout_s,
        }
    }

    /// The context budget a new session freezes.
    pub fn context(&self) -> ContextBudget {
        ContextBudget {
            context_window: self.context_window,
            compact_at: self.compact_at,
            keep_recent_turns: self.keep_recent_turns,
        }
    }

    /// `compact_at` must be a share between 0.1 and 1.0; `max_steps` at least 1 (0 would fail
    /// every turn before its first model request).
    fn check(&self) -> Result<(), String> {
        if self.max_steps == 0 {
            return Err(
                "[model] max_steps = 0 must be a number of model requests of at least 1".into(),
            );
        }
        if !(0.1..=1.0).contains(&self.compact_at) {
            return Err(format!(
                "[model] compact_at = {} must be a share of the context window between 0.1 and 1.0",
                self.compact_at
            ));
        }
        Ok(())
    }
}

/// `[approvals]`. An unknown `mode` is refused at load, naming `approvals.mode`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalsSection {
    /// `manual` (the default), `auto` or `deny`.
    #[serde(default)]
    pub mode: ApprovalMode,
}

impl ApprovalsSection {
    /// The mode a session's turn gets: `deny` here is the home's floor, which no session
    /// lifts; otherwise the session's own mode (`session.set_mode`) when it has one, else
    /// this one.
    pub fn mode_for(&self, session: Option<ApprovalMode>) -> ApprovalMode {
        match (self.mode, session) {
            (ApprovalMode::Deny, _) => ApprovalMode::Deny,
            (_, Some(own)) => own,
            (home, None) => home,
        }
    }
}

/// `[toolsets]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolsetsSection {
    /// The toolsets of a new session when `session.create` names none (default `terminal`,
    /// `file`, `todo`). Frozen per session.
    #[serde(default = "default_toolsets")]
    pub default: Vec<String>,
}

impl Default for ToolsetsSection {
    fn default() -> Self {
        ToolsetsSection {
            default: default_toolsets(),
        }
    }
}

/// `[delegation]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DelegationSection {
    /// Live children one parent turn may hold (default 2; 0 turns delegation off).
    #[serde(default = "two")]
    pub max_concurrent_children: u32,
    /// How deep children may nest; a top-level turn is depth 0 (default 1).
    #[serde(default = "one")]
    pub max_spawn_depth: u32,
}

impl Default for DelegationSection {
    fn default() -> Self {
        DelegationSection {
            max_concurrent_children: 2,
            max_spawn_depth: 1,
        }
    }
}

/// `[mcp_servers.<name>]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServer {
    /// The executable to start.
    pub command: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Variables added to its environment (credentials, often: they print redacted).
    #[serde(default)]
    pub env: BTreeMap<String, Secret>,
    /// `false`: the server is left out and its name is an unknown toolset (default true).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Seconds one tool call of this server may take before the model gets a tool error
    /// (default 600).
    #[serde(default = "drover_protocol::worker::McpServerSpec::default_tool_timeout_s")]
    pub tool_timeout_s: u64,
}

/// `[daemon]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonSection {
    /// Where the WebSocket endpoint listens, `host:port` (default `127.0.0.1:0`: loopback,
    /// a free port).
    #[serde(default = "default_listen")]
    pub listen: String,
    /// drover extra: how long a graceful stop waits for running turns (SPEC section 4: 10 s).
    #[serde(default = "default_drain_grace")]
    pub drain_grace_s: f64,
    /// How long a worker has to stop after an accepted `session.interrupt` before it gets
    /// SIGTERM, then SIGKILL (SPEC section 1: 5 s).
    #[serde(default = "default_interrupt_grace")]
    pub interrupt_grace_s: f64,
    /// How often a running turn that emits nothing else gets a live `turn.progress` event
    /// (SPEC section 2; default 5 s). Above 0, at most a day.
    #[serde(default = "default_progress_interval")]
    pub progress_interval_s: f64,
    /// A daemon started by a client (`drover daemon --started-by-client`) exits after this many
    /// seconds with nothing to do (SPEC section 1; default 900). Above 0. `drover daemon` in
    /// the foreground never idle-exits.
    #[serde(default = "default_idle_exit")]
    pub idle_exit_s: f64,
    /// The most bytes of UTF-8 a `prompt.submit` `text` may have (default 1 MiB);
    /// a longer one is `invalid_params` naming `text` and nothing is admitted. At least 1.
    #[serde(default = "default_max_input_bytes")]
    pub max_input_bytes: u64,
    /// How many finished turns' worker logs (`logs/workers/<execution_id>.log`) are kept; older
    /// ones are removed, oldest first ([`crate::worker_logs`]; default 1000). At least 1.
    #[serde(default = "default_worker_logs_keep")]
    pub worker_logs_keep: u64,
    /// SPEC section 1: a `listen` address beyond loopback needs this, and TLS.
    #[serde(default)]
    pub allow_remote: bool,
    /// PEM certificate chain; with `tls_key`, the endpoint is served over TLS (`wss://`).
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `tls_cert`.
    pub tls_key: Option<PathBuf>,
}

impl Default for DaemonSection {
    fn default() -> Self {
        DaemonSection {
            listen: default_listen(),
            drain_grace_s: default_drain_grace(),
            interrupt_grace_s: default_interrupt_grace(),
            progress_interval_s: default_progress_interval(),
            idle_exit_s: default_idle_exit(),
            max_input_bytes: default_max_input_bytes(),
            worker_logs_keep: default_worker_logs_keep(),
            allow_remote: false,
            tls_cert: None,
            tls_key: None,
        }
    }
}

impl DaemonSection {
    /// The TLS files, when both are set.
    pub fn tls(&self) -> Option<(&Path, &Path)> {
        Some((self.tls_cert.as_deref()?, self.tls_key.as_deref()?))
    }

    /// The `turn.progress` interval.
    pub fn progress_interval(&self) -> std::time::Duration {
        // `check` refused anything outside (0, PROGRESS_INTERVAL_MAX_S] at load.
        std::time::Duration::try_from_secs_f64(self.progress_interval_s)
            .unwrap_or_else(|_| std::time::Duration::from_secs_f64(default_progress_interval()))
    }

    /// How long a daemon started by a client waits, idle, before it exits.
    pub fn idle_exit(&self) -> std::time::Duration {
        // `check` refused anything not above 0 (or not finite) at load.
        std::time::Duration::try_from_secs_f64(self.idle_exit_s)
            .unwrap_or_else(|_| std::time::Duration::from_secs_f64(default_idle_exit()))
    }

    /// SPEC section 1: loopback only, unless `allow_remote`; beyond loopback, TLS. The message
    /// names the keys to set. `progress_interval_s` must be above 0 and at most a day;
    /// `idle_exit_s` above 0; `max_input_bytes` and `worker_logs_keep` at least 1.
    fn check(&self) -> Result<(), String> {
        if self.max_input_bytes == 0 {
            return Err(
                "[daemon] max_input_bytes = 0 must be a number of bytes of at least 1".into(),
            );
        }
        if self.worker_logs_keep == 0 {
            return Err(
                "[daemon] worker_logs_keep = 0 must be a number of logs of at least 1".into(),
            );
        }
        if !(self.idle_exit_s > 0.0 && self.idle_exit_s.is_finite()) {
            return Err(format!(
                "[daemon] idle_exit_s = {} must be a number of seconds above 0",
                self.idle_exit_s
            ));
        }
        if !(self.progress_interval_s > 0.0 && self.progress_interval_s <= PROGRESS_INTERVAL_MAX_S)
        {
            return Err(format!(
                "[daemon] progress_interval_s = {} must be a number of seconds above 0 and at \
                 most {PROGRESS_INTERVAL_MAX_S}",
                self.progress_interval_s
            ));
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(format!(
                "[daemon] tls_cert and tls_key go together; only {} is set",
                if self.tls_cert.is_some() {
                    "tls_cert"
                } else {
                    "tls_key"
                }
            ));
        }
        if is_loopback(&self.listen) {
            return Ok(());
        }
        if !self.allow_remote {
            return Err(format!(
                "[daemon] listen = {:?} is not a loopback address: other hosts could reach the \
                 daemon. Listen on 127.0.0.1, or set [daemon] allow_remote = true (with \
                 tls_cert and tls_key)",
                self.listen
            ));
        }
        if self.tls().is_none() {
            return Err(format!(
                "[daemon] listen = {:?} with allow_remote = true needs [daemon] tls_cert and \
                 tls_key: the token would cross the network in the clear over plain ws",
                self.listen
            ));
        }
        Ok(())
    }
}

/// Whether `listen` (`host:port`) names only loopback: a loopback IP, or `localhost`.
fn is_loopback(listen: &str) -> bool {
    if let Ok(addr) = listen.parse::<std::net::SocketAddr>() {
        return addr.ip().is_loopback();
    }
    listen
        .rsplit_once(':')
        .is_some_and(|(host, _)| host.eq_ignore_ascii_case("localhost"))
}

/// `[mqtt]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MqttSection {
    /// `mqtt://...` or `mqtts://...`; none: local only (`$DROVER_MQTT_URL` overrides it).
    pub url: Option<String>,
    /// The variable that holds the broker user name.
    pub username_env: Option<String>,
    /// The variable that holds the broker password.
    pub password_env: Option<String>,
    /// The prefix of every topic (default `drover/v1`).
    pub topic_base: Option<String>,
}

/// `[jobs]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobsSection {
    /// A runner refuses a dispatch signed longer ago than this (SPEC section 7, "Remote").
    #[serde(default = "default_dispatch_max_age")]
    pub dispatch_max_age_s: u64,
}

impl Default for JobsSection {
    fn default() -> Self {
        JobsSection {
            dispatch_max_age_s: default_dispatch_max_age(),
        }
    }
}

/// `[telemetry]` (SPEC section 1, docs/telemetry.md). Read once, at daemon start.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetrySection {
    /// The OTLP HTTP/protobuf base URL (`/v1/traces` and `/v1/metrics` are appended); unset,
    /// `$OTEL_EXPORTER_OTLP_ENDPOINT` is used; neither: no telemetry.
    pub otlp_endpoint: Option<String>,
    /// Whether spans may carry content (the input text, tool arguments and results). Default
    /// false: no prompt text, tool output or secret in any attribute.
    #[serde(default)]
    pub include_content: bool,
}

impl TelemetrySection {
    /// This section resolved against the environment.
    pub fn settings(&self) -> drover_telemetry::Settings {
        drover_telemetry::Settings::resolve(self.otlp_endpoint.as_deref(), self.include_content)
    }
}

/// `[sandbox]` (`docs/sandbox.md`). `mode`, `writable_roots`, `network` and
/// `required` are frozen per session at `session.create`; `[sandbox.env]` is read at each turn.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxSection {
    /// `workspace-write` (the default), `read-only` or `off`; another word is refused naming
    /// `sandbox.mode`.
    #[serde(default)]
    pub mode: SandboxMode,
    /// Absolute, existing directories tools may write under beyond the session cwd and the
    /// temp dir.
    #[serde(default)]
    pub writable_roots: Vec<String>,
    /// `false` refuses TCP connect and bind to tools (Landlock ABI 4 and later; default true).
    #[serde(default = "yes")]
    pub network: bool,
    /// Refuse to run a tool when a layer of the sandbox cannot be applied, rather than run it
    /// with less (default false).
    #[serde(default)]
    pub required: bool,
    /// `[sandbox.env]`: the environment of every tool process.
    #[serde(default)]
    pub env: SandboxEnvSection,
}

impl Default for SandboxSection {
    fn default() -> Self {
        SandboxSection {
            mode: SandboxMode::default(),
            writable_roots: Vec::new(),
            network: true,
            required: false,
            env: SandboxEnvSection::default(),
        }
    }
}

/// `[sandbox.env]`: tools start with the worker's environment minus `DROVER_*` and every
/// name holding `KEY`, `SECRET`, `TOKEN`, `PASSWORD` or `CREDENTIAL` (any case), except
/// `keep`; then `set` is added.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxEnvSection {
    /// Names kept although the removal rule matches them.
    #[serde(default)]
    pub keep: Vec<String>,
    /// Variables set for every tool process (values print redacted: they may be secrets the
    /// user hands to tools).
    #[serde(default)]
    pub set: BTreeMap<String, Secret>,
}

impl SandboxSection {
    /// What a new session freezes.
    pub fn frozen(&self) -> SessionSandbox {
        SessionSandbox {
            mode: self.mode,
            writable_roots: self.writable_roots.clone(),
            network: self.network,
            required: self.required,
        }
    }

    /// `[sandbox.env]` as the worker's policy carries it.
    pub fn tool_env(&self) -> ToolEnv {
        ToolEnv {
            keep: self.env.keep.clone(),
            set: self
                .env
                .set
                .iter()
                .map(|(name, value)| (name.clone(), value.expose().to_string()))
                .collect(),
        }
    }

    /// `writable_roots` are absolute, existing directories; `[sandbox.env]` names are
    /// variable names. The message names the key.
    fn check(&self) -> Result<(), String> {
        for root in &self.writable_roots {
            let path = Path::new(root);
            if !path.is_absolute() {
                return Err(format!(
                    "sandbox.writable_roots: {root:?} is not an absolute path"
                ));
            }
            if !path.is_dir() {
                return Err(format!(
                    "sandbox.writable_roots: {root:?} is not an existing directory"
                ));
            }
        }
        let bad_name = |name: &str| name.is_empty() || name.contains(['=', '\0']);
        if let Some(name) = self.env.keep.iter().find(|n| bad_name(n)) {
            return Err(format!(
                "sandbox.env.keep: {name:?} is not an environment variable name"
            ));
        }
        for (name, value) in &self.env.set {
            if bad_name(name) {
                return Err(format!(
                    "sandbox.env.set: {name:?} is not an environment variable name"
                ));
            }
            if value.expose().contains('\0') {
                return Err(format!(
                    "sandbox.env.set.{name}: the value holds a NUL byte"
                ));
            }
        }
        Ok(())
    }
}

fn default_dispatch_max_age() -> u64 {
    86_400
}

fn yes() -> bool {
    true
}
fn one() -> u32 {
    1
}
fn two() -> u32 {
    2
}
fn default_toolsets() -> Vec<String> {
    vec!["terminal".into(), "file".into(), "todo".into()]
}
fn default_listen() -> String {
    "127.0.0.1:0".into()
}
fn default_drain_grace() -> f64 {
    10.0
}
fn default_interrupt_grace() -> f64 {
    5.0
}
/// The largest `[daemon] progress_interval_s`: a day.
const PROGRESS_INTERVAL_MAX_S: f64 = 86_400.0;

fn default_progress_interval() -> f64 {
    5.0
}

fn default_idle_exit() -> f64 {
    900.0
}

fn default_max_input_bytes() -> u64 {
    1024 * 1024
}

fn default_worker_logs_keep() -> u64 {
    crate::worker_logs::DEFAULT_KEEP
}

/// A config file that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file exists but cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// `<home>/config.toml`.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not valid TOML, has an unknown key or a bad value, or breaks a `[daemon]`
    /// rule (a `listen` beyond loopback without `allow_remote` and TLS, a `progress_interval_s`
    /// outside (0, 86400]) or a `[sandbox]` one (a `writable_roots` entry that is relative or
    /// not an existing directory).
    #[error("{path}: {message}")]
    Parse {
        /// `<home>/config.toml`.
        path: String,
        /// What is wrong, naming the key.
        message: String,
    },
}

impl Config {
    /// Loads `<home>/config.toml`; a missing file gives the defaults.
    pub fn load(home: &Path) -> Result<Config, ConfigError> {
        let path = home.join("config.toml");
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(source) => {
                return Err(ConfigError::Read {
                    path: path.display().to_string(),
                    source,
                })
            }
        };
        let config: Config = toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        config
            .daemon
            .check()
            .and_then(|()| config.model.check())
            .and_then(|()| config.sandbox.check())
            .map_err(|message| ConfigError::Parse {
                path: path.display().to_string(),
                message,
            })?;
        Ok(config)
    }

    /// `[model] base_url`, else `$OPENAI_BASE_URL`.
    pub fn base_url(&self) -> Option<String> {
        self.model
            .base_url
            .clone()
            .or_else(|| std::env::var("OPENAI_BASE_URL").ok())
            .filter(|s| !s.is_empty())
    }

    /// The enabled `[mcp_servers]` named in `toolsets` (SPEC section 1: one toolset per MCP
    /// server, named after it), as the worker starts them. A disabled server is left out, so
    /// its toolset name is unknown.
    pub fn mcp_servers_of(
        &self,
        toolsets: &[String],
    ) -> BTreeMap<String, drover_protocol::worker::McpServerSpec> {
        toolsets
            .iter()
            .filter_map(|name| {
                let server = self.mcp_servers.get(name).filter(|s| s.enabled)?;
                Some((
                    name.clone(),
                    drover_protocol::worker::McpServerSpec {
                        command: server.command.clone(),
                        args: server.args.clone(),
                        env: server.env.clone(),
                        tool_timeout_s: server.tool_timeout_s,
                    },
                ))
            })
            .collect()
    }

    /// The API key from the variable named by `api_key_env`, else `$OPENAI_API_KEY`.
    pub fn api_key(&self) -> Option<Secret> {
        std::env::var(&self.model.api_key_env)
            .ok()
            .or_else(|| std::env::var("OPENAI_API_KEY").ok())
            .filter(|s| !s.is_empty())
            .map(Secret::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_file_gives_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let c = Config::load(dir.path()).unwrap();
        assert_eq!(c.approvals.mode, ApprovalMode::Manual);
        assert_eq!(c.model.settings(), ModelSettings::default());
        assert_eq!(c.model.max_steps, 50);
        assert_eq!(c.model.api_key_env, "OPENAI_API_KEY");
        assert_eq!(c.delegation.max_concurrent_children, 2);
        assert_eq!(c.daemon.listen, "127.0.0.1:0");
    }

    #[test]
    fn jobs_dispatch_max_age_defaults_to_a_day_and_is_read() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            Config::load(dir.path()).unwrap().jobs.dispatch_max_age_s,
            86_400
        );
        let file = dir.path().join("config.toml");
        std::fs::write(&file, "[jobs]\ndispatch_max_age_s = 600\n").unwrap();
        assert_eq!(
            Config::load(dir.path()).unwrap().jobs.dispatch_max_age_s,
            600
        );
        std::fs::write(&file, "[jobs]\ndispatch_max_age = 600\n").unwrap();
        let e = Config::load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("dispatch_max_age"), "{e}");
        std::fs::write(&file, "[jobs]\ndispatch_max_age_s = -1\n").unwrap();
        let e = Config::load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("dispatch_max_age_s"), "{e}");
    }

    #[test]
    fn bad_mode_and_unknown_keys_are_refused_naming_them() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.toml"),
            "[approvals]\nmode = \"yolo\"\n",
        )
        .unwrap();
        let e = Config::load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("config.toml"), "{e}");
        assert!(
            e.contains(r#"invalid approvals.mode "yolo" (expected one of: manual, auto, deny)"#),
            "{e}"
        );
        std::fs::write(dir.path().join("config.toml"), "[approvals]\nmode = 1\n").unwrap();
        let e = Config::load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("mode"), "{e}");
        std::fs::write(dir.path().join("config.toml"), "[model]\nnmae = \"x\"\n").unwrap();
        let e = Config::load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("nmae"), "{e}");
    }

    #[test]
    fn listen_beyond_loopback_needs_allow_remote_and_tls() {
        let dir = tempfile::tempdir().unwrap();
        let load = |daemon: &str| {
            std::fs::write(
                dir.path().join("config.toml"),
                format!("[daemon]\n{daemon}\n"),
            )
            .unwrap();
            Config::load(dir.path()).map_err(|e| e.to_string())
        };
        for ok in ["127.0.0.1:0", "[::1]:7000", "localhost:7000", "127.0.0.2:0"] {
            load(&format!("listen = {ok:?}")).unwrap();
        }
        let e = load("listen = \"0.0.0.0:0\"").unwrap_err();
        assert!(
            e.contains("[daemon] listen") && e.contains("allow_remote"),
            "{e}"
        );
        let e = load("listen = \"0.0.0.0:0\"\nallow_remote = true").unwrap_err();
        assert!(e.contains("tls_cert") && e.contains("tls_key"), "{e}");
        let e = load("tls_cert = \"/c.pem\"").unwrap_err();
        assert!(e.contains("tls_key"), "{e}");
        let c = load("listen = \"0.0.0.0:0\"\nallow_remote = true\ntls_cert = \"/c.pem\"\ntls_key = \"/k.pem\"")
            .unwrap();
        assert_eq!(c.daemon.tls().unwrap().0, Path::new("/c.pem"));
        // Loopback may have allow_remote without TLS: nothing leaves the host.
        load("allow_remote = true").unwrap();
    }

    #[test]
    fn every_approval_mode_is_read_by_its_lowercase_word() {
        let dir = tempfile::tempdir().unwrap();
        for mode in ApprovalMode::ALL {
            std::fs::write(
                dir.path().join("config.toml"),
                format!("[approvals]\nmode = \"{mode}\"\n"),
            )
            .unwrap();
            assert_eq!(Config::load(dir.path()).unwrap().approvals.mode, mode);
        }
    }

    #[test]
    fn a_sessions_mode_wins_unless_the_home_says_deny() {
        use ApprovalMode::{Auto, Deny, Manual};
        for (home, session, want) in [
            (Manual, None, Manual),
            (Auto, None, Auto),
            (Deny, None, Deny),
            (Manual, Some(Auto), Auto),
            (Manual, Some(Deny), Deny),
            (Auto, Some(Manual), Manual),
            (Auto, Some(Deny), Deny),
            (Deny, Some(Auto), Deny),
            (Deny, Some(Manual), Deny),
        ] {
            let section = ApprovalsSection { mode: home };
            assert_eq!(section.mode_for(session), want, "{home} {session:?}");
        }
    }

    #[test]
    fn model_keys_left_out_keep_the_model_settings_defaults() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.toml"), "[model]\nmax_retries = 0\n").unwrap();
        let c = Config::load(dir.path()).unwrap();
        assert_eq!(
            c.model.settings(),
            ModelSettings {
                max_retries: 0,
                ..ModelSettings::default()
            }
        );
        assert_eq!(c.model.max_steps, 50);
    }

    #[test]
    fn counted_keys_default_are_read_and_zero_is_refused() {
        type Read = fn(&Config) -> u64;
        let keys: [(&str, u64, Read); 3] = [
            ("max_input_bytes", 1 << 20, |c| c.daemon.max_input_bytes),
            ("worker_logs_keep", 1000, |c| c.daemon.worker_logs_keep),
            ("max_steps", 50, |c| u64::from(c.model.max_steps)),
        ];
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.toml");
        for (key, default, read) in keys {
            let section = if key == "max_steps" {
                "model"
            } else {
                "daemon"
            };
            let _ = std::fs::remove_file(&file);
            assert_eq!(read(&Config::load(dir.path()).unwrap()), default, "{key}");
            std::fs::write(&file, format!("[{section}]\n{key} = 10\n")).unwrap();
            assert_eq!(read(&Config::load(dir.path()).unwrap()), 10, "{key}");
            std::fs::write(&file, format!("[{section}]\n{key} = 0\n")).unwrap();
            let e = Config::load(dir.path()).unwrap_err().to_string();
            assert!(e.contains(&format!("{key} = 0")), "{e}");
        }
    }

    #[test]
    fn liveness_keys_default_and_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.toml");
        let c = Config::load(dir.path()).unwrap();
        assert_eq!(c.model.stall_timeout_s, 120);
        assert_eq!(c.model.settings().stall_timeout_s, 120);
        assert_eq!(c.daemon.progress_interval_s, 5.0);
        assert_eq!(
            c.daemon.progress_interval(),
            std::time::Duration::from_secs(5)
        );
        std::fs::write(
            &file,
            "[model]\nstall_timeout_s = 2\n\n[daemon]\nprogress_interval_s = 0.25\n\n\
             [mcp_servers.slow]\ncommand = \"srv\"\ntool_timeout_s = 3\n\n\
             [mcp_servers.plain]\ncommand = \"srv\"\n",
        )
        .unwrap();
        let c = Config::load(dir.path()).unwrap();
        assert_eq!(c.model.settings().stall_timeout_s, 2);
        assert_eq!(
            c.daemon.progress_interval(),
            std::time::Duration::from_millis(250)
        );
        let specs = c.mcp_servers_of(&["slow".into(), "plain".into()]);
        assert_eq!(specs.get("slow").map(|s| s.tool_timeout_s), Some(3));
        assert_eq!(specs.get("plain").map(|s| s.tool_timeout_s), Some(600));
        for bad in ["0", "-1", "nan", "inf", "86401"] {
            std::fs::write(&file, format!("[daemon]\nprogress_interval_s = {bad}\n")).unwrap();
            let e = Config::load(dir.path()).unwrap_err().to_string();
            assert!(e.contains("progress_interval_s"), "{bad}: {e}");
        }
        std::fs::write(&file, "[model]\nstall_timeout_s = -1\n").unwrap();
        let e = Config::load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("stall_timeout_s"), "{e}");
        std::fs::write(
            &file,
            "[mcp_servers.x]\ncommand = \"s\"\ntool_timeout = 3\n",
        )
        .unwrap();
        let e = Config::load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("tool_timeout"), "{e}");
    }

    #[test]
    fn idle_exit_defaults_to_900_s_and_must_be_above_0() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.toml");
        let c = Config::load(dir.path()).unwrap();
        assert_eq!(c.daemon.idle_exit(), std::time::Duration::from_secs(900));
        std::fs::write(&file, "[daemon]\nidle_exit_s = 1.5\n").unwrap();
        let c = Config::load(dir.path()).unwrap();
        assert_eq!(c.daemon.idle_exit(), std::time::Duration::from_millis(1500));
        for bad in ["0", "-1", "nan", "inf"] {
            std::fs::write(&file, format!("[daemon]\nidle_exit_s = {bad}\n")).unwrap();
            let e = Config::load(dir.path()).unwrap_err().to_string();
            assert!(e.contains("idle_exit_s"), "{bad}: {e}");
        }
    }

    #[test]
    fn file_values_are_read() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.toml"),
            "[model]\nbase_url = \"http://127.0.0.1:1/v1\"\nname = \"m\"\nstream = false\n",
        )
        .unwrap();
        let c = Config::load(dir.path()).unwrap();
        assert_eq!(c.base_url().as_deref(), Some("http://127.0.0.1:1/v1"));
        assert_eq!(c.model.name.as_deref(), Some("m"));
        assert!(!c.model.stream);
    }

    #[test]
    fn sandbox_defaults_and_values_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let c = Config::load(dir.path()).unwrap();
        assert_eq!(c.sandbox.mode, SandboxMode::WorkspaceWrite);
        assert!(c.sandbox.network && !c.sandbox.required);
        assert_eq!(c.sandbox.frozen(), SessionSandbox::default());
        let root = dir.path().display().to_string();
        std::fs::write(
            dir.path().join("config.toml"),
            format!(
                "[sandbox]\nmode = \"read-only\"\nwritable_roots = [{root:?}]\nnetwork = false\n\
                 required = true\n\n[sandbox.env]\nkeep = [\"GH_TOKEN\"]\n\
                 set = {{ DEPLOY_KEY = \"hunter2\" }}\n"
            ),
        )
        .unwrap();
        let c = Config::load(dir.path()).unwrap();
        assert_eq!(
            c.sandbox.frozen(),
            SessionSandbox {
                mode: SandboxMode::ReadOnly,
                writable_roots: vec![root],
                network: false,
                required: true,
            }
        );
        let env = c.sandbox.tool_env();
        assert_eq!(env.keep, vec!["GH_TOKEN".to_string()]);
        assert_eq!(
            env.set.get("DEPLOY_KEY").map(String::as_str),
            Some("hunter2")
        );
        // The config prints no value of [sandbox.env] set, nor the policy's.
        assert!(!format!("{c:?}").contains("hunter2"), "{c:?}");
        assert!(!format!("{env:?}").contains("hunter2"), "{env:?}");
    }

    #[test]
    fn bad_sandbox_values_are_refused_naming_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.toml");
        let load = |text: String| {
            std::fs::write(&file, text).unwrap();
            Config::load(dir.path()).unwrap_err().to_string()
        };
        let e = load("[sandbox]\nmode = \"yes\"\n".into());
        assert!(e.contains("sandbox.mode") && e.contains("yes"), "{e}");
        let e = load("[sandbox]\nwritable_roots = [\"relative/dir\"]\n".into());
        assert!(
            e.contains("sandbox.writable_roots") && e.contains("absolute"),
            "{e}"
        );
        let missing = dir.path().join("no-such-dir").display().to_string();
        let e = load(format!("[sandbox]\nwritable_roots = [{missing:?}]\n"));
        assert!(
            e.contains("sandbox.writable_roots") && e.contains("no-such-dir"),
            "{e}"
        );
        let e = load("[sandbox]\nnetwork = \"no\"\n".into());
        assert!(e.contains("network"), "{e}");
        let e = load("[sandbox]\nmodes = \"off\"\n".into());
        assert!(e.contains("modes"), "{e}");
        let e = load("[sandbox.env]\nset = { \"A=B\" = \"x\" }\n".into());
        assert!(e.contains("sandbox.env.set"), "{e}");
        let e = load("[sandbox.env]\nkeeps = []\n".into());
        assert!(e.contains("keeps"), "{e}");
    }

    #[test]
    fn mcp_env_values_and_the_api_key_print_redacted() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.toml"),
            "[mcp_servers.gh]\ncommand = \"srv\"\nenv = { GITHUB_TOKEN = \"ghp-secret\" }\n",
        )
        .unwrap();
        let c = Config::load(dir.path()).unwrap();
        assert!(!format!("{c:?}").contains("ghp-secret"));
        let specs = c.mcp_servers_of(&["gh".into()]);
        assert!(!format!("{specs:?}").contains("ghp-secret"));
        assert_eq!(
            specs["gh"].env.get("GITHUB_TOKEN").map(Secret::expose),
            Some("ghp-secret")
        );
    }
}
