//! The client subcommands `stop` and `approvals`, and [`connect`], which every client command
//! uses to find or start the daemon ([`drover_client`]). `drover run` is in the `run` module;
//! `sessions` and the other session commands are in `session_cmd`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use drover_client::{Client, ConnectOptions, StartDaemon};
use drover_owner::config::Config;
use drover_protocol::client::{ApprovalRuleRef, ApprovalRuleRemoved, ApprovalRules, NoParams};
use drover_protocol::ClientRequest;

use crate::spinner::Spinner;
use crate::Exit;

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

/// Connects to the home's daemon, starting one in the background when none runs (SPEC
/// section 8); the wait shows a spinner.
pub async fn connect(home: &Path) -> Result<Client> {
    // A daemon that cannot start because of its config would only say so at its start: say
    // it in the config's own words before trying.
    if drover_client::owner_pid(home).is_none() {
        if let Err(e) = Config::load(home) {
            bail!("{e}");
        }
    }
    let program = std::env::current_exe().context("cannot find the drover executable")?;
    let options = ConnectOptions::new(home, StartDaemon::Spawn { program });
    Ok(Spinner::during("the daemon", Client::connect(options)).await?)
}

/// `drover stop`: SIGTERM to the daemon, then wait for it to exit.
pub async fn stop(home: PathBuf) -> Result<Exit> {
    // The lock names the owner even when daemon.json is gone.
    let pid = drover_client::owner_pid(&home)
        .or_else(|| drover_client::read_daemon_info(&home).map(|i| i.pid))
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
    let c = connect(&home).await?;
    match command {
        ApprovalsCommand::List { json } => {
            let raw = c
                .request_value(ClientRequest::ApprovalsList(NoParams {}))
                .await?;
            let list: ApprovalRules = drover_client::parse_result("approvals.list", raw.clone())?;
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
            let r: ApprovalRuleRemoved = c
                .request(ClientRequest::ApprovalsRemove(ApprovalRuleRef {
                    pattern_key: pattern_key.clone(),
                }))
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
