//! The client subcommands: `run`, `sessions`, `stop`, and finding or starting the daemon.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use drover_owner::config::Config;
use drover_owner::home::DaemonInfo;
use drover_protocol::event as ev;
use serde_json::{json, Value};

use crate::client::Client;
use crate::Exit;

/// `drover run` arguments (SPEC section 8).
#[derive(Args, Debug)]
pub struct RunArgs {
    /// Continue this session instead of creating a new one.
    #[arg(long)]
    session: Option<String>,
    /// Model name for a new session (default: [model] name).
    #[arg(long)]
    model: Option<String>,
    /// Model endpoint for a new session (default: [model] base_url or $OPENAI_BASE_URL).
    #[arg(long = "base-url", value_name = "URL")]
    base_url: Option<String>,
    /// Answer approval prompts with this choice when there is no terminal.
    #[arg(long, value_parser = ["once", "session", "deny"])]
    approve: Option<String>,
    /// Answer clarify questions with this text when there is no terminal.
    #[arg(long, value_name = "TEXT")]
    answer: Option<String>,
    /// The prompt.
    prompt: String,
}

/// Runs a future on a small runtime; errors print on stderr and give exit 1.
pub fn block_on(f: impl std::future::Future<Output = Result<Exit>>) -> Exit {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("drover: cannot start the async runtime: {e}");
            return Exit::Failed;
        }
    };
    match rt.block_on(f) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("drover: {e:#}");
            Exit::Failed
        }
    }
}

/// Whether `pid` runs (a zombie waiting to be reaped counts as gone).
fn pid_alive(pid: u32) -> bool {
    i32::try_from(pid).is_ok_and(drover_platform::is_alive)
}

/// Finds the home's running daemon, or starts one in the background and waits for it.
pub async fn ensure_daemon(home: &Path) -> Result<(DaemonInfo, Client)> {
    let pinned = Config::load(home).ok().and_then(|c| c.daemon.tls_cert);
    if let Some(info) = DaemonInfo::read(home).filter(|i| pid_alive(i.pid)) {
        match Client::connect(&info.url, &info.token, pinned.as_deref()).await {
            Ok(c) => return Ok((info, c)),
            // A certificate that is not the configured one will not become it by waiting.
            Err(e) if is_tls_failure(&e) => return Err(e),
            Err(_) => {}
        }
    }
    // A daemon that cannot start because of its config would only say so in its log.
    if let Err(e) = Config::load(home) {
        bail!("{e}");
    }
    // An owner holds the home but has no daemon.json yet (starting, or it was deleted and is
    // being rewritten): wait for it rather than start one that can only exit 3.
    let owner = drover_owner::home::owner_pid(home);
    let mut child = match owner {
        Some(_) => None,
        None => Some(spawn_daemon(home)?),
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(info) = DaemonInfo::read(home).filter(|i| pid_alive(i.pid)) {
            if let Ok(c) = Client::connect(&info.url, &info.token, pinned.as_deref()).await {
                return Ok((info, c));
            }
        }
        if let Some(Ok(Some(status))) = child.as_mut().map(|c| c.try_wait()) {
            // Exit 3: another daemon won the race for this home; keep looking for its file.
            if status.code() != Some(i32::from(Exit::HomeOwned.code())) {
                bail!(
                    "the daemon exited with {status}; see {}",
                    home.join("logs").join("daemon.log").display()
                );
            }
        }
        if tokio::time::Instant::now() > deadline {
            let who = owner.map_or_else(
                || "the daemon".to_string(),
                |p| format!("the daemon (pid {p})"),
            );
            bail!(
                "{who} did not answer within 15 s; see {}",
                home.join("logs").join("daemon.log").display()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether a connection failed in its TLS handshake (a wrong certificate, say).
fn is_tls_failure(e: &anyhow::Error) -> bool {
    use tokio_tungstenite::tungstenite::Error as WsError;
    // tokio-rustls reports a refused certificate as an io::Error wrapping the rustls error.
    let rustls_io = |io: &std::io::Error| io.get_ref().is_some_and(|i| i.is::<rustls::Error>());
    e.chain().any(|cause| {
        match cause.downcast_ref::<WsError>() {
            Some(WsError::Tls(_)) => return true,
            Some(WsError::Io(io)) => return rustls_io(io),
            _ => {}
        }
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(rustls_io)
    })
}

/// Starts `drover daemon` for `home` in its own session, with null stdio.
fn spawn_daemon(home: &Path) -> Result<std::process::Child> {
    let exe = std::env::current_exe().context("cannot find the drover executable")?;
    std::fs::create_dir_all(home).with_context(|| format!("cannot create {}", home.display()))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("daemon")
        .arg("--home")
        .arg(home)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // A new session: the daemon must outlive this terminal and its Ctrl-C.
    drover_platform::spawn_detached(&mut cmd).context("cannot start the daemon")
}

/// `session.create` errors in the words of `drover run`'s flags.
fn explain_create_error(e: &drover_protocol::RpcError, home: &Path) -> String {
    let config = home.join("config.toml");
    match e.data.get("field").and_then(|f| f.as_str()) {
        Some("base_url") => format!(
            "no model endpoint: pass --base-url URL, set [model] base_url in {}, or set $OPENAI_BASE_URL",
            config.display()
        ),
        Some("model") => format!(
            "no model: pass --model NAME or set [model] name in {}",
            config.display()
        ),
        _ => format!("session.create: {e}"),
    }
}

fn rpc<T>(r: Result<T, drover_protocol::RpcError>, what: &str) -> Result<T> {
    r.map_err(|e| anyhow!("{what}: {e}"))
}

/// `drover run`.
pub async fn run(home: PathBuf, args: RunArgs) -> Result<Exit> {
    let (_info, mut c) = ensure_daemon(&home).await?;
    let snapshot = match &args.session {
        Some(id) => match c.call("session.resume", json!({"session_id": id})).await? {
            Ok(v) => v,
            Err(e) if e.reason() == "not_found" => {
                bail!(
                    "no session {id} in {}; `drover sessions` lists them",
                    home.display()
                )
            }
            Err(e) => bail!("session.resume: {e}"),
        },
        None => {
            let cwd = std::env::current_dir().context("cannot read the current directory")?;
            let mut params = json!({
                "request_id": uuid::Uuid::new_v4().to_string(),
                "cwd": cwd,
                "source": "cli",
            });
            if let Some(m) = &args.model {
                params["model"] = json!(m);
            }
            // `$OPENAI_BASE_URL` of this command fills what config.toml leaves out (SPEC section
            // 1); the daemon may have been started from another environment.
            let base_url = args
                .base_url
                .clone()
                .or_else(|| Config::load(&home).ok().and_then(|c| c.base_url()));
            if let Some(u) = base_url {
                params["base_url"] = json!(u);
            }
            match c.call("session.create", params).await? {
                Ok(v) => v,
                Err(e) => bail!("{}", explain_create_error(&e, &home)),
            }
        }
    };
    let session_id = snapshot["session_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    eprintln!("drover: session {session_id}");
    let receipt = rpc(
        c.call(
            "prompt.submit",
            json!({"session_id": session_id, "input_id": uuid::Uuid::new_v4().to_string(), "text": args.prompt}),
        )
        .await?,
        "prompt.submit",
    )?;
    let admission_id = receipt["admission_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    follow(&mut c, &session_id, &admission_id, &args).await
}

/// Streams one admission's events until it settles.
async fn follow(
    c: &mut Client,
    session_id: &str,
    admission_id: &str,
    args: &RunArgs,
) -> Result<Exit> {
    let mut mine = false;
    let mut generation: Option<u64> = None;
    let mut printed = false;
    let mut ends_with_newline = true;
    let mut interrupts = 0u32;
    let mut stdout = std::io::stdout();
    loop {
        let event = tokio::select! {
            e = c.next_event(Duration::from_secs(30)) => e?,
            _ = tokio::signal::ctrl_c() => {
                interrupts += 1;
                if interrupts > 1 {
                    return Ok(Exit::Interrupted);
                }
                eprintln!("\ndrover: interrupting (Ctrl-C again to leave at once)");
                match generation {
                    Some(g) => { let _ = c.call("session.interrupt", json!({"session_id": session_id, "execution_generation": g})).await?; }
                    None => { let _ = c.call("prompt.cancel", json!({"session_id": session_id, "admission_id": admission_id})).await?; }
                }
                continue;
            }
        };
        let Some(event) = event else {
            // Quiet for a while: make sure the turn did not settle while we were not looking.
            let r = rpc(
                c.call("prompt.receipt", json!({"session_id": session_id, "admission_id": admission_id, "include_result": true}))
                    .await?,
                "prompt.receipt",
            )?;
            if r["status"] == "terminal" || r["status"] == "unknown" {
                let outcome = r["outcome"].as_str().unwrap_or("unknown").to_string();
                return Ok(finish(
                    &outcome,
                    r["result"].get("error").and_then(Value::as_str),
                    interrupts,
                ));
            }
            continue;
        };
        let p = &event.payload;
        let ours = p.get("admission_id").and_then(Value::as_str) == Some(admission_id);
        match event.kind.as_str() {
            ev::TURN_STARTED if ours => {
                mine = true;
                generation = p["execution_generation"].as_u64();
            }
            ev::MESSAGE_DELTA if mine => {
                let text = p["text"].as_str().unwrap_or_default();
                if !text.is_empty() {
                    let _ = write!(stdout, "{text}");
                    let _ = stdout.flush();
                    printed = true;
                    ends_with_newline = text.ends_with('\n');
                }
            }
            ev::TOOL_START if mine => {
                if printed && !ends_with_newline {
                    println!();
                    ends_with_newline = true;
                }
                eprintln!(
                    "[{}] {}",
                    p["name"].as_str().unwrap_or("tool"),
                    p["context"].as_str().unwrap_or_default()
                );
            }
            ev::TOOL_COMPLETE if mine && p["is_error"].as_bool() == Some(true) => {
                eprintln!("[{}] error", p["name"].as_str().unwrap_or("tool"));
            }
            ev::APPROVAL_REQUEST | ev::CLARIFY_REQUEST if mine => {
                if let Some(code) = answer_prompt(c, session_id, &event.kind, p, args).await? {
                    return Ok(code);
                }
            }
            ev::MESSAGE_COMPLETE if ours => {
                let text = p["text"].as_str().unwrap_or_default();
                if !printed && !text.is_empty() {
                    let _ = write!(stdout, "{text}");
                    ends_with_newline = text.ends_with('\n');
                    printed = true;
                }
                if printed && !ends_with_newline {
                    println!();
                    ends_with_newline = true;
                }
            }
            ev::TURN_SETTLED if ours => {
                let outcome = p["outcome"].as_str().unwrap_or("unknown");
                return Ok(finish(
                    outcome,
                    p.get("error").and_then(Value::as_str),
                    interrupts,
                ));
            }
            ev::ADMISSION_UPDATED if ours && p["outcome"] == "cancelled" => {
                eprintln!("drover: cancelled before it started");
                return Ok(if interrupts > 0 {
                    Exit::Interrupted
                } else {
                    Exit::Failed
                });
            }
            _ => {}
        }
    }
}

fn finish(outcome: &str, error: Option<&str>, interrupts: u32) -> Exit {
    match outcome {
        "completed" => Exit::Ok,
        "unknown" => {
            eprintln!("drover: the turn's outcome is unknown (its worker or the daemon died while it ran); it will not be replayed");
            Exit::Unknown
        }
        "interrupted" if interrupts > 0 => Exit::Interrupted,
        other => {
            match error {
                Some(e) => eprintln!("drover: turn {other}: {e}"),
                None => eprintln!("drover: turn {other}"),
            }
            Exit::Failed
        }
    }
}

/// Answers an approval or clarify prompt from flags or the terminal. `Some(exit)` when it
/// cannot be answered here (exit 5; the prompt stays open for other clients).
async fn answer_prompt(
    c: &mut Client,
    session_id: &str,
    kind: &str,
    p: &Value,
    args: &RunArgs,
) -> Result<Option<Exit>> {
    let prompt_id = p["prompt_id"].as_str().unwrap_or_default().to_string();
    let generation = p["execution_generation"].as_u64().unwrap_or(0);
    let approval = kind == ev::APPROVAL_REQUEST;
    let flag = if approval {
        args.approve.clone()
    } else {
        args.answer.clone()
    };
    let answer = match flag {
        Some(a) => a,
        None if std::io::stdin().is_terminal() => {
            let question = if approval {
                format!(
                    "approve `{}` ({})? [once/session/always/deny] ",
                    p["command"].as_str().unwrap_or_default(),
                    p["description"].as_str().unwrap_or_default()
                )
            } else {
                let choices = p["choices"].as_array().map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join("/")
                });
                match choices.filter(|c| !c.is_empty()) {
                    Some(ch) => format!("{} [{ch}] ", p["question"].as_str().unwrap_or_default()),
                    None => format!("{} ", p["question"].as_str().unwrap_or_default()),
                }
            };
            eprint!("{question}");
            let line = tokio::task::spawn_blocking(|| {
                let mut s = String::new();
                std::io::stdin().read_line(&mut s).map(|_| s)
            })
            .await??;
            line.trim().to_string()
        }
        None => {
            eprintln!(
                "drover: {} prompt is waiting (prompt_id {prompt_id}) and there is no terminal; \
                 pass --{} or answer it from another client",
                if approval { "an approval" } else { "a clarify" },
                if approval { "approve" } else { "answer" }
            );
            return Ok(Some(Exit::PromptWaiting));
        }
    };
    let (method, field) = if approval {
        ("approval.respond", "choice")
    } else {
        ("clarify.respond", "answer")
    };
    let mut params = json!({"session_id": session_id, "execution_generation": generation, "prompt_id": prompt_id});
    params[field] = json!(answer);
    if let Err(e) = c.call(method, params).await? {
        eprintln!("drover: {method}: {e}");
    }
    Ok(None)
}

/// `drover sessions`.
pub async fn sessions(home: PathBuf, as_json: bool) -> Result<Exit> {
    let (_info, mut c) = ensure_daemon(&home).await?;
    let list = rpc(
        c.call("session.list", json!({"limit": 1000})).await?,
        "session.list",
    )?;
    if as_json {
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(Exit::Ok);
    }
    println!(
        "{:<36}  {:<8}  {:<20}  {:>7}  {:>7}  TITLE",
        "SESSION", "SOURCE", "MODEL", "RUNNING", "PENDING"
    );
    for s in list["sessions"].as_array().into_iter().flatten() {
        println!(
            "{:<36}  {:<8}  {:<20}  {:>7}  {:>7}  {}",
            s["session_id"].as_str().unwrap_or_default(),
            s["source"].as_str().unwrap_or_default(),
            s["model"].as_str().unwrap_or_default(),
            if s["running"].as_bool() == Some(true) {
                "yes"
            } else {
                "no"
            },
            s["pending_count"].as_u64().unwrap_or(0),
            s["title"].as_str().unwrap_or_default(),
        );
        if let Some(error) = s["error"].as_str() {
            println!("{:<36}  error: {error}", "");
        }
    }
    Ok(Exit::Ok)
}

/// `drover stop`: SIGTERM to the daemon, then wait for it to exit.
pub async fn stop(home: PathBuf) -> Result<Exit> {
    // The lock names the owner even when daemon.json is gone.
    let pid = drover_owner::home::owner_pid(&home)
        .or_else(|| DaemonInfo::read(&home).map(|i| i.pid))
        .filter(|pid| pid_alive(*pid));
    let Some(pid) = pid else {
        eprintln!("drover: no daemon is running for {}", home.display());
        return Ok(Exit::Ok);
    };
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .with_context(|| format!("cannot signal daemon pid {pid}"))?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while pid_alive(pid) {
        if tokio::time::Instant::now() > deadline {
            bail!("daemon pid {pid} did not exit within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("drover: daemon pid {pid} stopped");
    Ok(Exit::Ok)
}

/// `drover approvals list|rm`.
#[derive(Subcommand, Debug)]
pub enum ApprovalsCommand {
    /// List the stored rules (pattern keys approved with `always`).
    List {
        /// Print JSON (`{rules: [{pattern_key, description, created_at}]}`).
        #[arg(long)]
        json: bool,
    },
    /// Remove a stored rule; dangerous commands of that kind ask again.
    Rm {
        /// The rule's pattern key, as `list` shows it.
        pattern_key: String,
    },
}

/// `drover approvals`.
pub async fn approvals(home: PathBuf, command: ApprovalsCommand) -> Result<Exit> {
    let (_info, mut c) = ensure_daemon(&home).await?;
    match command {
        ApprovalsCommand::List { json } => {
            let list = rpc(c.call("approvals.list", json!({})).await?, "approvals.list")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
                return Ok(Exit::Ok);
            }
            let rules = list["rules"].as_array().cloned().unwrap_or_default();
            if rules.is_empty() {
                eprintln!("drover: no stored approval rules");
            }
            for r in rules {
                println!(
                    "{:<24}  {}",
                    r["pattern_key"].as_str().unwrap_or_default(),
                    r["description"].as_str().unwrap_or_default()
                );
            }
            Ok(Exit::Ok)
        }
        ApprovalsCommand::Rm { pattern_key } => {
            let r = rpc(
                c.call("approvals.remove", json!({"pattern_key": pattern_key}))
                    .await?,
                "approvals.remove",
            )?;
            if r["removed"].as_bool() == Some(true) {
                eprintln!("drover: removed rule {pattern_key}");
                Ok(Exit::Ok)
            } else {
                eprintln!("drover: no stored rule named {pattern_key}");
                Ok(Exit::Failed)
            }
        }
    }
}
