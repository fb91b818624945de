//! Real third-party ACP agents for the tests of drover as an ACP client: Codex through
//! `@zed-industries/codex-acp` (OpenAI's Responses API) and OpenCode (`opencode acp`, chat
//! completions through an OpenAI-compatible provider), installed from npm in
//! `tests/agents/node_modules` by `scripts/test.sh` (`npm ci --prefix tests/agents
//! --ignore-scripts`), and pointed at a [`MockModel`](crate::MockModel) on loopback.
//!
//! - [`AgentKit::codex`] / [`AgentKit::opencode`]: an [`AgentSetup`] whose configuration lives
//!   in a folder of the test (its own `HOME`, `CODEX_HOME`, XDG folders), so the agent reads
//!   nothing of the machine's and talks to nothing but the mock model: no model catalogue
//!   fetch, no update check, no analytics, no background npm install. `None`, with the reason
//!   printed, when the npm packages are missing.
//! - [`AgentSetup::config_toml`]: the `[agents.<name>]` entry of drover's `config.toml` that
//!   runs the same agent; [`AgentSetup::command_line`]: the process alone (a cleared
//!   environment plus the setup's), for a test without drover.
//! - [`shell_call`]: a scripted model reply that asks the agent's own shell tool to run a
//!   command, in that agent's tool name and argument shape, so that the agent asks for
//!   permission (`session/request_permission`) before running it.
//!
//! Both agents keep running after their stdin closes: whoever starts one stops its process
//! group.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::json;

use crate::mock_model::Reply;

/// How long drover lets one of these agents stay silent mid-turn (`stall_timeout_s`): far above
/// a scripted turn (a second or two), far below a test's own bound.
pub const STALL_TIMEOUT_S: u64 = 60;

/// The model name each agent is configured with. Codex knows `gpt-5.4`'s metadata, so it does
/// not open the turn with a warning about an unknown model.
const CODEX_MODEL: &str = "gpt-5.4";
const OPENCODE_MODEL: &str = "mock-model";

/// The variable Codex reads the mock model's (unused) API key from.
const CODEX_KEY_VAR: &str = "DROVER_MOCK_API_KEY";

/// Which agent a setup runs: their shell tools differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentKind {
    /// `codex-acp`: tool `exec_command`, arguments `{cmd, sandbox_permissions, justification}`.
    Codex,
    /// `opencode acp`: tool `bash`, arguments `{command, description}`.
    OpenCode,
}

/// One agent, configured to use only a mock model.
#[derive(Clone, Debug)]
pub struct AgentSetup {
    /// The key of its `[agents.<name>]` entry: `codex` or `opencode`.
    pub name: String,
    /// Which agent it is.
    pub kind: AgentKind,
    /// The program and its arguments (absolute paths).
    pub command: Vec<String>,
    /// The variables it needs, literal values (its homes and switches; no secret).
    pub env: BTreeMap<String, String>,
    /// The `[agents.<name>]` entry for drover's `config.toml`: `command`, `env` and
    /// `stall_timeout_s`; the agent runs in drover's sandbox (the default).
    pub config_toml: String,
}

/// Where the agents of `tests/agents` are installed.
#[derive(Clone, Debug)]
pub struct AgentKit {
    /// `tests/agents`.
    pub dir: PathBuf,
    /// codex-acp's native binary (its npm launcher only finds and runs it).
    pub codex_acp: PathBuf,
    /// OpenCode's native binary (its npm launcher needs a postinstall script; this is what
    /// that script links).
    pub opencode: PathBuf,
}

impl AgentKit {
    /// The installed agents, or why they are not there.
    pub fn find() -> Result<AgentKit, String> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/agents");
        let dir = dir.canonicalize().unwrap_or(dir);
        let modules = dir.join("node_modules");
        let arch = match std::env::consts::ARCH {
            "x86_64" => "x64",
            "aarch64" => "arm64",
            other => return Err(format!("no agent packages for the {other} architecture")),
        };
        let codex_acp = modules.join(format!(
            "@zed-industries/codex-acp-linux-{arch}/bin/codex-acp"
        ));
        // OpenCode ships a build for x86-64 CPUs without AVX2 too; npm installs both.
        let baseline = arch == "x64" && !cpu_has_avx2();
        let opencode_package = if baseline {
            "opencode-linux-x64-baseline".to_string()
        } else {
            format!("opencode-linux-{arch}")
        };
        let opencode = modules.join(opencode_package).join("bin/opencode");
        for needed in [&codex_acp, &opencode] {
            if !needed.is_file() {
                return Err(format!(
                    "{} is missing: the agent tests need the npm packages of tests/agents; \
                     install them with `bash scripts/test.sh` (it runs `npm ci` when they are \
                     missing) or `npm ci --prefix tests/agents --ignore-scripts`",
                    needed.display()
                ));
            }
        }
        Ok(AgentKit {
            dir,
            codex_acp,
            opencode,
        })
    }

    /// The installed agents; `None`, printing why, when they are missing.
    fn found() -> Option<AgentKit> {
        match AgentKit::find() {
            Ok(kit) => Some(kit),
            Err(why) => {
                eprintln!("real ACP agents unavailable: {why}");
                None
            }
        }
    }

    /// Codex through codex-acp, its homes under `dir/codex`, against the model at
    /// `model_base_url` (`http://127.0.0.1:PORT/v1`; it posts to `/responses` there).
    ///
    /// `CODEX_HOME/config.toml`: model `gpt-5.4` from a provider of its own (`wire_api =
    /// "responses"`, no retries so that a scripted failure is seen at once), approval policy
    /// `on-request` and sandbox `workspace-write` (so a command asking for escalation, as
    /// [`shell_call`] does, goes through `session/request_permission`), no update check, no
    /// analytics.
    pub fn codex(dir: &Path, model_base_url: &str) -> Option<AgentSetup> {
        let kit = AgentKit::found()?;
        let root = dir.join("codex");
        let home = root.join("home");
        // Under HOME, where the sandbox lets an agent write (docs/decisions/agents-sandbox.md).
        let codex_home = home.join(".codex");
        for folder in [&home, &codex_home] {
            std::fs::create_dir_all(folder).expect("create codex-acp's folders");
        }
        let config = format!(
            r#"model = {model}
model_provider = "drover-mock"
approval_policy = "on-request"
sandbox_mode = "workspace-write"
check_for_update_on_startup = false

[analytics]
enabled = false

[model_providers.drover-mock]
name = "drover mock model"
base_url = {base_url}
env_key = "{CODEX_KEY_VAR}"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
"#,
            model = toml_string(CODEX_MODEL),
            base_url = toml_string(model_base_url),
        );
        std::fs::write(codex_home.join("config.toml"), config)
            .expect("write CODEX_HOME/config.toml");
        let env = BTreeMap::from([
            ("HOME".to_string(), path_string(&home)),
            ("CODEX_HOME".to_string(), path_string(&codex_home)),
            (CODEX_KEY_VAR.to_string(), "mock".to_string()),
        ]);
        Some(AgentSetup::new(
            "codex",
            AgentKind::Codex,
            vec![path_string(&kit.codex_acp)],
            env,
        ))
    }

    /// OpenCode (`opencode acp`), its homes under `dir/opencode`, against the model at
    /// `model_base_url` through an OpenAI-compatible provider (chat completions).
    ///
    /// `XDG_CONFIG_HOME/opencode/opencode.json`: the provider and model, permission `ask` for
    /// `bash`, `edit` and `webfetch` (so [`shell_call`] goes through
    /// `session/request_permission`), no title agent (it would take a scripted reply of its
    /// own), no autoupdate, no sharing. Variables: no models.dev fetch, no LSP download, no
    /// default plugins. Beside the config, a `node_modules/` and a `package-lock.json` that
    /// already list `@opencode-ai/plugin`: without them OpenCode installs that package from
    /// npm into its config folder in the background at every start.
    pub fn opencode(dir: &Path, model_base_url: &str) -> Option<AgentSetup> {
        let kit = AgentKit::found()?;
        let root = dir.join("opencode");
        let home = root.join("home");
        let xdg: Vec<(&str, PathBuf)> = ["config", "data", "cache", "state"]
            .iter()
            .map(|kind| {
                // Where they are by default: under HOME, which the sandbox lets an agent write.
                let (var, under_home) = match *kind {
                    "config" => ("XDG_CONFIG_HOME", ".config"),
                    "data" => ("XDG_DATA_HOME", ".local/share"),
                    "cache" => ("XDG_CACHE_HOME", ".cache"),
                    _ => ("XDG_STATE_HOME", ".local/state"),
                };
                (var, home.join(under_home))
            })
            .collect();
        let config_dir = home.join(".config/opencode");
        std::fs::create_dir_all(config_dir.join("node_modules"))
            .expect("create OpenCode's config folder");
        std::fs::create_dir_all(&home).expect("create OpenCode's HOME");
        for (_, folder) in &xdg {
            std::fs::create_dir_all(folder).expect("create OpenCode's XDG folders");
        }
        let config = json!({
            "provider": {
                "drover-mock": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "drover mock model",
                    "options": {"baseURL": model_base_url, "apiKey": "mock"},
                    "models": {OPENCODE_MODEL: {"name": OPENCODE_MODEL}},
                },
            },
            "model": format!("drover-mock/{OPENCODE_MODEL}"),
            "small_model": format!("drover-mock/{OPENCODE_MODEL}"),
            "permission": {"bash": "ask", "edit": "ask", "webfetch": "ask"},
            "agent": {"title": {"disable": true}},
            "autoupdate": false,
            "share": "disabled",
            "snapshot": false,
        });
        let config = serde_json::to_string_pretty(&config).expect("OpenCode's config as JSON");
        std::fs::write(config_dir.join("opencode.json"), config).expect("write opencode.json");
        let lock = json!({"packages": {"": {"dependencies": {"@opencode-ai/plugin": "*"}}}});
        std::fs::write(config_dir.join("package-lock.json"), lock.to_string())
            .expect("write OpenCode's package-lock.json");
        let mut env = BTreeMap::from([("HOME".to_string(), path_string(&home))]);
        for (var, folder) in &xdg {
            env.insert(var.to_string(), path_string(folder));
        }
        for switch in [
            "OPENCODE_DISABLE_MODELS_FETCH",
            "OPENCODE_DISABLE_AUTOUPDATE",
            "OPENCODE_DISABLE_LSP_DOWNLOAD",
            "OPENCODE_DISABLE_SHARE",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS",
            "OPENCODE_DISABLE_CLAUDE_CODE",
        ] {
            env.insert(switch.to_string(), "1".to_string());
        }
        Some(AgentSetup::new(
            "opencode",
            AgentKind::OpenCode,
            vec![path_string(&kit.opencode), "acp".to_string()],
            env,
        ))
    }
}

impl AgentSetup {
    fn new(
        name: &str,
        kind: AgentKind,
        command: Vec<String>,
        env: BTreeMap<String, String>,
    ) -> Self {
        let command_toml = command
            .iter()
            .map(|part| toml_string(part))
            .collect::<Vec<_>>()
            .join(", ");
        let env_toml = env
            .iter()
            .map(|(key, value)| format!("{key} = {}", toml_string(value)))
            .collect::<Vec<_>>()
            .join(", ");
        let config_toml = format!(
            "[agents.{name}]\ncommand = [{command_toml}]\nenv = {{ {env_toml} }}\n\
             stall_timeout_s = {STALL_TIMEOUT_S}\n"
        );
        AgentSetup {
            name: name.to_string(),
            kind,
            command,
            env,
            config_toml,
        }
    }

    /// The agent's process as drover would start it, without drover: a cleared environment
    /// with `PATH` (this process's) and `LANG`, then [`AgentSetup::env`]; stdio is the
    /// caller's to set.
    pub fn command_line(&self) -> std::process::Command {
        let mut command = std::process::Command::new(&self.command[0]);
        command.args(&self.command[1..]).env_clear();
        if let Some(path) = std::env::var_os("PATH") {
            command.env("PATH", path);
        }
        command.env("LANG", "C.UTF-8").envs(&self.env);
        command
    }

    /// The name of the agent's shell tool in its model requests.
    pub fn shell_tool(&self) -> &'static str {
        match self.kind {
            AgentKind::Codex => "exec_command",
            AgentKind::OpenCode => "bash",
        }
    }
}

/// A model reply that asks `agent`'s shell tool to run `command` (a fresh call id each time).
///
/// Codex: `exec_command {cmd, sandbox_permissions: "require_escalated", justification}`: the
/// escalation is what makes codex-acp ask under `on-request` (a command its sandbox allows, or
/// one it knows to be safe such as `echo`, would run without asking), and the approved command
/// runs outside Codex's own sandbox. OpenCode: `bash {command, description}`, which asks under
/// permission `bash = "ask"`.
pub fn shell_call(agent: &AgentSetup, command: &str) -> Reply {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let id = format!("call_shell_{}", NEXT.fetch_add(1, Ordering::Relaxed));
    let args = match agent.kind {
        AgentKind::Codex => json!({
            "cmd": command,
            "sandbox_permissions": "require_escalated",
            "justification": format!("run `{command}`"),
        }),
        AgentKind::OpenCode => json!({
            "command": command,
            "description": format!("run `{command}`"),
        }),
    };
    Reply::tool_call(id, agent.shell_tool(), args)
}

/// A TOML basic string: JSON's string escapes are valid TOML ones.
fn toml_string(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

fn path_string(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// Whether the CPU has AVX2 (`/proc/cpuinfo`); true when that cannot be read, as on most
/// machines.
fn cpu_has_avx2() -> bool {
    std::fs::read_to_string("/proc/cpuinfo")
        .map(|info| {
            info.lines()
                .find(|line| line.starts_with("flags"))
                .is_none_or(|flags| flags.split_whitespace().any(|flag| flag == "avx2"))
        })
        .unwrap_or(true)
}
