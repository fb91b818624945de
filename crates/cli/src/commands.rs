//! The client subcommands: `run`, `stop`, `approvals`, and finding or starting the daemon
//! (`sessions` and the other session commands are in `crate::session_cmd`). Requests and
//! results are the typed protocol ([`drover_protocol::client`]).

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use drover_owner::config::Config;
use drover_owner::home::{DaemonFile, DaemonInfo};
use drover_protocol::client::{
    AdmissionOutcome, AdmissionReceipt, AdmissionRef, AdmissionStatus, ApprovalChoice,
    ApprovalRespondParams, ApprovalRuleRef, ApprovalRuleRemoved, ApprovalRules, ClarifyAnswer,
    ClarifyRespondParams, InterruptParams, NoParams, OpenPrompt, PromptReceiptParams,
    PromptResponse, PromptSubmitParams, SessionCreateParams, SessionRef, SessionSnapshot,
};
use drover_protocol::event::{EventPayload, TurnEnd};
use drover_protocol::rpc::ErrorData;
use drover_protocol::{ClientRequest, RpcError};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::client::{parse_result, Client};
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
fn explain_create_error(e: &RpcError, home: &Path) -> String {
    let config = home.join("config.toml");
    let field = serde_json::from_value::<ErrorData>(e.data.clone())
        .ok()
        .and_then(|d| d.field);
    match field.as_deref() {
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

/// Calls `request` and reads its result; an error answer fails with the method's name.
async fn call<R: DeserializeOwned>(c: &mut Client, request: ClientRequest) -> Result<R> {
    let method = request.method();
    c.request(&request)
        .await?
        .map_err(|e| anyhow!("{method}: {e}"))
}

/// `drover run`.
pub async fn run(home: PathBuf, args: RunArgs) -> Result<Exit> {
    let (_info, mut c) = ensure_daemon(&home).await?;
    let snapshot: SessionSnapshot = match &args.session {
        Some(id) => {
            let resume = ClientRequest::SessionResume(SessionRef {
                session_id: id.clone(),
            });
            match c.request(&resume).await? {
                Ok(v) => v,
                Err(e) if e.reason() == "not_found" => {
                    bail!(
                        "no session {id} in {}; `drover sessions` lists them",
                        home.display()
                    )
                }
                Err(e) => bail!("session.resume: {e}"),
            }
        }
        None => {
            let cwd = std::env::current_dir().context("cannot read the current directory")?;
            let cwd = cwd
                .to_str()
                .ok_or_else(|| anyhow!("the current directory {} is not UTF-8", cwd.display()))?;
            // `$OPENAI_BASE_URL` of this command fills what config.toml leaves out (SPEC section
            // 1); the daemon may have been started from another environment.
            let base_url = args
                .base_url
                .clone()
                .or_else(|| Config::load(&home).ok().and_then(|c| c.base_url()));
            let create = ClientRequest::SessionCreate(SessionCreateParams {
                request_id: uuid::Uuid::new_v4().to_string(),
                cwd: Some(cwd.to_string()),
                model: args.model.clone(),
                base_url,
                api_key: None,
                toolsets: None,
                system_prompt: None,
                title: None,
                source: Some("cli".into()),
            });
            match c.request(&create).await? {
                Ok(v) => v,
                Err(e) => bail!("{}", explain_create_error(&e, &home)),
            }
        }
    };
    let session_id = snapshot.session_id;
    eprintln!("drover: session {session_id}");
    let receipt: AdmissionReceipt = call(
        &mut c,
        ClientRequest::PromptSubmit(PromptSubmitParams {
            session_id: session_id.clone(),
            input_id: uuid::Uuid::new_v4().to_string(),
            text: args.prompt.clone(),
        }),
    )
    .await?;
    follow(&mut c, &session_id, &receipt.admission_id, &args).await
}

/// The admission an event is about, for the events that name one.
fn admission_of(event: &EventPayload) -> Option<&str> {
    match event {
        EventPayload::TurnStarted(p) => Some(&p.admission_id),
        EventPayload::MessageComplete(p) => Some(&p.admission_id),
        EventPayload::TurnSettled(p) => Some(&p.admission_id),
        EventPayload::AdmissionUpdated(p) => Some(&p.admission_id),
        _ => None,
    }
}

/// How a settled receipt's turn ended: `unknown` while its status is, else its outcome.
fn receipt_end(r: &AdmissionReceipt) -> Result<Option<TurnEnd>> {
    let outcome = match r.status {
        AdmissionStatus::Queued | AdmissionStatus::Started => return Ok(None),
        AdmissionStatus::Unknown => return Ok(Some(TurnEnd::Unknown)),
        AdmissionStatus::Terminal => r.outcome.ok_or_else(|| {
            anyhow!(
                "prompt.receipt: admission {} is terminal without an outcome",
                r.admission_id
            )
        })?,
    };
    Ok(Some(match outcome {
        AdmissionOutcome::Completed => TurnEnd::Completed,
        AdmissionOutcome::Interrupted => TurnEnd::Interrupted,
        AdmissionOutcome::Failed => TurnEnd::Failed,
        AdmissionOutcome::Rejected => TurnEnd::Rejected,
        AdmissionOutcome::Cancelled => TurnEnd::Cancelled,
    }))
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
                // Either answer will do: the turn's events say what happened.
                let stop = match generation {
                    Some(g) => ClientRequest::SessionInterrupt(InterruptParams {
                        session_id: session_id.to_string(),
                        execution_generation: g,
                    }),
                    None => ClientRequest::PromptCancel(AdmissionRef {
                        session_id: session_id.to_string(),
                        admission_id: admission_id.to_string(),
                    }),
                };
                let _ = c.request_value(&stop).await?;
                continue;
            }
        };
        let Some(event) = event else {
            // Quiet for a while: make sure the turn did not settle while we were not looking.
            let r: AdmissionReceipt = call(
                c,
                ClientRequest::PromptReceipt(PromptReceiptParams {
                    session_id: session_id.to_string(),
                    admission_id: admission_id.to_string(),
                    include_result: Some(true),
                }),
            )
            .await?;
            if let Some(end) = receipt_end(&r)? {
                let error = r.result.as_ref().and_then(|res| res.error.as_deref());
                return Ok(finish(end, error, interrupts));
            }
            continue;
        };
        let ours = admission_of(&event.event) == Some(admission_id);
        match &event.event {
            EventPayload::TurnStarted(p) if ours => {
                mine = true;
                generation = Some(p.execution_generation);
            }
            EventPayload::MessageDelta(p) if mine && !p.text.is_empty() => {
                let _ = write!(stdout, "{}", p.text);
                let _ = stdout.flush();
                printed = true;
                ends_with_newline = p.text.ends_with('\n');
            }
            EventPayload::ToolStart(p) if mine => {
                if printed && !ends_with_newline {
                    println!();
                    ends_with_newline = true;
                }
                eprintln!("[{}] {}", p.name, p.context);
            }
            EventPayload::ToolComplete(p) if mine && p.is_error => {
                // `name` is null only for a call the owner does not know.
                eprintln!("[{}] error", p.name.as_deref().unwrap_or("tool"));
            }
            EventPayload::ApprovalRequest(prompt) | EventPayload::ClarifyRequest(prompt)
                if mine =>
            {
                if let Some(code) = answer_prompt(c, session_id, prompt, args).await? {
                    return Ok(code);
                }
            }
            EventPayload::MessageComplete(p) if ours => {
                if !printed && !p.text.is_empty() {
                    let _ = write!(stdout, "{}", p.text);
                    ends_with_newline = p.text.ends_with('\n');
                    printed = true;
                }
                if printed && !ends_with_newline {
                    println!();
                    ends_with_newline = true;
                }
            }
            EventPayload::TurnSettled(p) if ours => {
                return Ok(finish(p.outcome, p.error.as_deref(), interrupts));
            }
            EventPayload::AdmissionUpdated(p)
                if ours && p.outcome == Some(AdmissionOutcome::Cancelled) =>
            {
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

/// The turn's word in `drover: turn <word>` (the wire's snake_case word).
fn end_word(end: TurnEnd) -> &'static str {
    match end {
        TurnEnd::Completed => "completed",
        TurnEnd::Interrupted => "interrupted",
        TurnEnd::Failed => "failed",
        TurnEnd::Rejected => "rejected",
        TurnEnd::Cancelled => "cancelled",
        TurnEnd::Unknown => "unknown",
    }
}

fn finish(end: TurnEnd, error: Option<&str>, interrupts: u32) -> Exit {
    match end {
        TurnEnd::Completed => Exit::Ok,
        TurnEnd::Unknown => {
            eprintln!("drover: the turn's outcome is unknown (its worker or the daemon died while it ran); it will not be replayed");
            Exit::Unknown
        }
        TurnEnd::Interrupted if interrupts > 0 => Exit::Interrupted,
        other => {
            let other = end_word(other);
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
    prompt: &OpenPrompt,
    args: &RunArgs,
) -> Result<Option<Exit>> {
    let (prompt_id, approval) = match prompt {
        OpenPrompt::Approval(p) => (&p.prompt_id, true),
        OpenPrompt::Clarify(p) => (&p.prompt_id, false),
    };
    let flag = if approval {
        args.approve.clone()
    } else {
        args.answer.clone()
    };
    let answer = match flag {
        Some(a) => a,
        None if std::io::stdin().is_terminal() => {
            let question = match prompt {
                OpenPrompt::Approval(p) => format!(
                    "approve `{}` ({})? [once/session/always/deny] ",
                    p.command, p.description
                ),
                OpenPrompt::Clarify(p) if p.choices.is_empty() => format!("{} ", p.question),
                OpenPrompt::Clarify(p) => format!("{} [{}] ", p.question, p.choices.join("/")),
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
    let respond = match prompt {
        OpenPrompt::Approval(p) => {
            let choice = match serde_json::from_value::<ApprovalChoice>(Value::String(answer)) {
                Ok(choice) => choice,
                Err(e) => {
                    eprintln!("drover: approval.respond: choice: {e}");
                    return Ok(None);
                }
            };
            ClientRequest::ApprovalRespond(ApprovalRespondParams {
                session_id: session_id.to_string(),
                execution_generation: p.execution_generation,
                prompt_id: p.prompt_id.clone(),
                choice,
            })
        }
        OpenPrompt::Clarify(p) => ClientRequest::ClarifyRespond(ClarifyRespondParams {
            session_id: session_id.to_string(),
            execution_generation: p.execution_generation,
            prompt_id: p.prompt_id.clone(),
            answer: ClarifyAnswer::Text(answer),
        }),
    };
    let method = respond.method();
    match c.request::<PromptResponse>(&respond).await? {
        Ok(_) => {}
        Err(e) => eprintln!("drover: {method}: {e}"),
    }
    Ok(None)
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
            let request = ClientRequest::ApprovalsList(NoParams {});
            let raw = c
                .request_value(&request)
                .await?
                .map_err(|e| anyhow!("approvals.list: {e}"))?;
            let list: ApprovalRules = parse_result("approvals.list", raw.clone())?;
            if json {
                println!("{}", serde_json::to_string_pretty(&raw)?);
                return Ok(Exit::Ok);
            }
            if list.rules.is_empty() {
                eprintln!("drover: no stored approval rules");
            }
            for r in list.rules {
                println!("{:<24}  {}", r.pattern_key, r.description);
            }
            Ok(Exit::Ok)
        }
        ApprovalsCommand::Rm { pattern_key } => {
            let r: ApprovalRuleRemoved = call(
                &mut c,
                ClientRequest::ApprovalsRemove(ApprovalRuleRef {
                    pattern_key: pattern_key.clone(),
                }),
            )
            .await?;
            if r.removed {
                eprintln!("drover: removed rule {pattern_key}");
                Ok(Exit::Ok)
            } else {
                eprintln!("drover: no stored rule named {pattern_key}");
                Ok(Exit::Failed)
            }
        }
    }
}
