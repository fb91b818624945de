//! `<home>/config.toml` (SPEC section 1). A missing file means defaults; `$OPENAI_BASE_URL`
//! and `$OPENAI_API_KEY` (or the variable named by `api_key_env`) fill what the file leaves out.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use drover_ledger::SessionSandbox;
use drover_protocol::sandbox::{SandboxMode, ToolEnv};
use drover_protocol::{ApprovalMode, ContextBudget, ModelSettings, Secret};
use serde::Deserialize;

mod agents;
mod budget;
pub use agents::AgentEntry;
pub use budget::{BudgetSection, PriceEntry};

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
    /// `[agents.<name>]`: external agents a session may run (docs/agents.md).
    #[serde(default)]
    pub agents: BTreeMap<String, AgentEntry>,
    /// `[pricing."<model>"]`: what a model's tokens cost (docs/configuration.md, "Budgets").
    #[serde(default)]
    pub pricing: BTreeMap<String, PriceEntry>,
    /// `[budget]`: spend limits (docs/configuration.md, "Budgets").
    #[serde(default)]
    pub budget: BudgetSection,
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
    /// The API the endpoint speaks: `chat` (default) or `responses`. Frozen per session.
    pub api: drover_protocol::ModelApi,
    /// Seconds to open a connection (TCP and TLS; default 10). Frozen per session.
    pub connect_timeout_s: u64,
    /// Seconds from a request sent to its first byte (default 60). Frozen per session.
    pub first_byte_timeout_s: u64,
    /// One more PEM bundle of certificate authorities the endpoint may chain to, beside the
    /// system store and `SSL_CERT_FILE` / `SSL_CERT_DIR`. Read at each turn.
    pub ca_file: Option<PathBuf>,
    /// The proxy of every model request (`http://host:port`), else `HTTPS_PROXY` /
    /// `HTTP_PROXY` / `NO_PROXY`. Read at each turn.
    pub proxy: Option<String>,
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
            api: settings.api,
            connect_timeout_s: settings.connect_timeout_s,
            first_byte_timeout_s: settings.first_byte_timeout_s,
            ca_file: None,
            proxy: None,
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
            api: self.api,
            connect_timeout_s: self.connect_timeout_s,
            first_byte_timeout_s: self.first_byte_timeout_s,
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
            .and_then(|()| config.budget.check())
            .and_then(|()| budget::check_pricing(&config.pricing))
            .and_then(|()| {
                config
                    .agents
                    .iter()
                    .try_for_each(|(name, agent)| agent.check(name))
            })
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
mod tests;
