//! One daemon with one session on a mock model ([`OneSession`] and its builder), and the
//! shorter set-ups the end-to-end tests share.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Result};
use serde_json::{json, Value};

use crate::harness::daemon::Daemon;
use crate::harness::home::TestHome;
use crate::harness::rpc::{uuid_like, Client};
use crate::harness::state_db::db_rows;

/// A daemon on a fresh home with a mock model and one session, attached by `client`: the start
/// of most end-to-end turn tests. [`OneSession::builder`] sets what differs from the defaults.
pub struct OneSession {
    /// The model the daemon is configured with.
    pub model: crate::MockModel,
    /// The daemon's home.
    pub home: TestHome,
    /// The running daemon.
    pub daemon: Daemon,
    /// A client attached to the session.
    pub client: Client,
    /// The session `client` created.
    pub session_id: String,
    /// The `session.create` result.
    pub created: Value,
}

impl OneSession {
    /// Starts it: [`TestHome::write_model_config`] with `stream` and `extra` TOML, the daemon
    /// with `env`, and a session whose cwd is [`TestHome::work`].
    pub async fn start(
        bin: &Path,
        stream: bool,
        extra: &str,
        env: &[(&str, &str)],
    ) -> Result<OneSession> {
        OneSession::builder(bin)
            .stream(stream)
            .config(extra)
            .env(env)
            .start()
            .await
    }

    /// A streaming model, no extra config or environment, the session's cwd the home and its
    /// toolsets the daemon's default, until the builder says otherwise.
    pub fn builder(bin: &Path) -> OneSessionBuilder {
        OneSessionBuilder {
            bin: bin.to_path_buf(),
            stream: true,
            drain_grace_s: 1.0,
            model_keys: String::new(),
            extra: String::new(),
            env: Vec::new(),
            toolsets: None,
            cwd: None,
            home: None,
            closable_connections: false,
        }
    }

    /// Submits `text` to the session; returns the receipt.
    pub async fn submit(&mut self, text: &str) -> Result<Value> {
        self.client.submit(&self.session_id, text).await
    }

    /// Submits `text` and waits for its turn to settle; returns the admission id and outcome.
    pub async fn turn(&mut self, text: &str) -> Result<(String, String)> {
        self.client.turn(&self.session_id, text).await
    }

    /// Like [`OneSession::turn`], failing unless the turn settles `completed`; returns the
    /// admission id.
    pub async fn complete_turn(&mut self, text: &str) -> Result<String> {
        self.client.complete_turn(&self.session_id, text).await
    }

    /// The JSON content of the session's one tool message answering `tool_call_id`; panics
    /// when there is not exactly one.
    pub fn tool_result(&self, tool_call_id: &str) -> Value {
        let rows = db_rows(
            &self.home.db(),
            &format!(
                "SELECT content FROM messages WHERE session_id = '{}' AND tool_call_id = '{tool_call_id}'",
                self.session_id
            ),
        );
        assert_eq!(rows.len(), 1, "{tool_call_id}: {rows:?}");
        let content = rows[0][0].as_str().unwrap_or_default();
        serde_json::from_str(content).unwrap_or_else(|e| panic!("{tool_call_id}: {e}: {content}"))
    }

    /// `(tool_call_id, tool_name, content)` of the session's tool messages, in order.
    pub fn tool_messages(&self) -> Vec<Vec<Value>> {
        db_rows(
            &self.home.db(),
            &format!(
                "SELECT tool_call_id, tool_name, content FROM messages
                 WHERE session_id = '{}' AND role = 'tool' ORDER BY id",
                self.session_id
            ),
        )
    }

    /// `session.resume` of the session.
    pub async fn resume(&mut self) -> Result<Value> {
        self.client
            .call_ok("session.resume", json!({"session_id": self.session_id}))
            .await
    }

    /// Waits for `turn.settled` of `admission_id` in the session and returns its outcome.
    pub async fn wait_settled(&mut self, admission_id: &str) -> Result<String> {
        self.client.wait_settled(admission_id).await
    }

    /// `session.interrupt` of the session at `execution_generation`, failing on an error answer.
    pub async fn interrupt(&mut self, execution_generation: impl Into<Value>) -> Result<Value> {
        let params = self.interrupt_params(execution_generation.into());
        self.client.call_ok("session.interrupt", params).await
    }

    /// `session.interrupt` at `execution_generation`, expecting a refusal; returns its reason.
    pub async fn interrupt_refused(
        &mut self,
        execution_generation: impl Into<Value>,
    ) -> Result<String> {
        let params = self.interrupt_params(execution_generation.into());
        self.client.call_err("session.interrupt", params).await
    }

    fn interrupt_params(&self, execution_generation: Value) -> Value {
        json!({"session_id": self.session_id, "execution_generation": execution_generation})
    }

    /// `prompt.receipt` of `admission_id` in the session, with its result when `include_result`.
    pub async fn receipt(&mut self, admission_id: &str, include_result: bool) -> Result<Value> {
        self.client
            .receipt(&self.session_id, admission_id, include_result)
            .await
    }
}

/// What a [`OneSession`] is started with.
pub struct OneSessionBuilder {
    bin: PathBuf,
    stream: bool,
    drain_grace_s: f64,
    model_keys: String,
    extra: String,
    env: Vec<(String, String)>,
    toolsets: Option<Vec<String>>,
    cwd: Option<PathBuf>,
    home: Option<TestHome>,
    closable_connections: bool,
}

impl OneSessionBuilder {
    /// Whether the model streams its answers.
    pub fn stream(mut self, stream: bool) -> Self {
        self.stream = stream;
        self
    }

    /// The daemon's `drain_grace_s` (1 s unless set).
    pub fn drain_grace_s(mut self, seconds: f64) -> Self {
        self.drain_grace_s = seconds;
        self
    }

    /// TOML lines added to the config's `[model]` table.
    pub fn model_keys(mut self, keys: &str) -> Self {
        self.model_keys = keys.to_string();
        self
    }

    /// TOML appended to the config verbatim.
    pub fn config(mut self, extra: &str) -> Self {
        self.extra = extra.to_string();
        self
    }

    /// Environment variables of the daemon.
    pub fn env(mut self, env: &[(&str, &str)]) -> Self {
        self.env = env
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect();
        self
    }

    /// The session's toolsets (`session.create`'s `toolsets`).
    pub fn toolsets(mut self, toolsets: &[&str]) -> Self {
        self.toolsets = Some(toolsets.iter().map(|t| t.to_string()).collect());
        self
    }

    /// The session's working directory ([`TestHome::work`] unless set).
    pub fn cwd(mut self, cwd: &Path) -> Self {
        self.cwd = Some(cwd.to_path_buf());
        self
    }

    /// The home to use (a fresh one unless set), for a config that names paths in it.
    pub fn home(mut self, home: TestHome) -> Self {
        self.home = Some(home);
        self
    }

    /// Keeps the model's connections closable from its start
    /// ([`MockModel::keep_connections_closable`](crate::MockModel::keep_connections_closable)),
    /// for a test that plays a server closing idle connections.
    pub fn closable_connections(mut self) -> Self {
        self.closable_connections = true;
        self
    }

    /// Starts the model, the home, the daemon and the session.
    pub async fn start(self) -> Result<OneSession> {
        let model = crate::MockModel::start().await;
        if self.closable_connections {
            model.keep_connections_closable();
        }
        let home = match self.home {
            Some(home) => home,
            None => TestHome::new()?,
        };
        home.write_model_config_with_keys(
            &model.base_url(),
            self.stream,
            self.drain_grace_s,
            &self.model_keys,
            &self.extra,
        )?;
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str()))
            .collect();
        let daemon = Daemon::start_with_env(&self.bin, home.path(), &env).await?;
        let mut client = daemon.client().await?;
        let cwd = self.cwd.as_deref().unwrap_or(home.work());
        let mut params = json!({"request_id": uuid_like(), "cwd": cwd});
        if let Some(toolsets) = &self.toolsets {
            params["toolsets"] = json!(toolsets);
        }
        let created = client.call_ok("session.create", params).await?;
        let session_id = created["session_id"]
            .as_str()
            .ok_or_else(|| anyhow!("session.create without session_id: {created}"))?
            .to_string();
        Ok(OneSession {
            model,
            home,
            daemon,
            client,
            session_id,
            created,
        })
    }
}

/// The model's tool call `call_rm`: `rm -rf <dir>` on the terminal, a command that needs
/// approval.
pub fn rm_rf_call(dir: &Path) -> crate::Reply {
    crate::Reply::tool_call(
        "call_rm",
        "terminal",
        json!({"command": format!("rm -rf {}", dir.display())}),
    )
}

/// Makes the directory `<parent>/victim` and scripts `model` to delete it ([`rm_rf_call`]),
/// then to answer `answer`. Returns the victim.
pub fn script_rm_victim(model: &crate::MockModel, parent: &Path, answer: &str) -> PathBuf {
    let victim = parent.join("victim");
    std::fs::create_dir(&victim).unwrap();
    model.push(rm_rf_call(&victim));
    model.push(crate::Reply::text(answer));
    victim
}

/// A mock model and a fresh home whose model config points at it (`stream` or not).
pub async fn model_home(stream: bool) -> Result<(crate::MockModel, TestHome)> {
    let model = crate::MockModel::start().await;
    let home = TestHome::new()?;
    home.write_model_config(&model.base_url(), stream, "")?;
    Ok((model, home))
}

/// [`model_home`] (streaming) with a daemon on it and a client attached, but no session: the
/// start of the tests that make their own sessions, or none.
pub async fn model_daemon(bin: &Path) -> Result<(crate::MockModel, TestHome, Daemon, Client)> {
    let (model, home) = model_home(true).await?;
    let daemon = Daemon::start(bin, home.path()).await?;
    let client = daemon.client().await?;
    Ok((model, home, daemon, client))
}
