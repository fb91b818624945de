//! The client subcommands `stop` and `approvals`, and [`connect`], which every client command
//! uses to find or start the daemon ([`drover_client`]). `drover run` is in the `run` module;
//! `sessions` and the other session commands are in `session_cmd`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use drover_client::{Client, ConnectOptions, StartDaemon};
use drover_owner::config::Config;
use drover_protocol::client::{
    ApprovalRule, ApprovalRuleOrigin, ApprovalRuleRef, ApprovalRuleRemoved, ApprovalRules, NoParams,
};
use drover_protocol::ClientRequest;

use crate::display::printable;
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
    // it in the config's own words before trying. The config is read first: who holds the
    // home's lock is read from /proc/locks, whose first read in a process waits for an RCU
    // grace period (8-12 ms here), so only a bad config pays for it.
    if let Err(e) = Config::load(home) {
        if drover_client::owner_pid(home).is_none() {
            bail!("{e}");
        }
    }
    let program = std::env::current_exe().context("cannot find the drover executable")?;
    let options = ConnectOptions::new(home, StartDaemon::Spawn { program });
    Ok(Spinner::during("the daemon", Client::connect(options)).await?)
}

/// The process `drover stop` signals: a pid and the start time it must still have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct StopTarget {
    pid: i32,
    start_time: u64,
}

/// Which process is the home's daemon. The home lock's holder is (the kernel names it, even
/// when daemon.json is gone); else the pid in daemon.json, but only while it has the start
/// time recorded there: a stale file's pid may belong to another process now. `Ok(None)`: no
/// daemon runs.
fn stop_target(home: &Path) -> Result<Option<StopTarget>> {
    let start_time_of = |pid: u32| {
        let pid = i32::try_from(pid).ok()?;
        Some(StopTarget {
            pid,
            start_time: drover_platform::process_start_time(pid)?,
        })
    };
    if let Some(target) = drover_client::owner_pid(home)
        .filter(|pid| pid_alive(*pid))
        .and_then(start_time_of)
    {
        return Ok(Some(target));
    }
    let Some(info) = drover_client::read_daemon_info(home) else {
        return Ok(None);
    };
    let Some(now) = Some(info.pid)
        .filter(|pid| pid_alive(*pid))
        .and_then(start_time_of)
    else {
        return Ok(None);
    };
    let file = home.join(drover_protocol::daemon_file::DAEMON_FILE);
    match info.start_time {
        Some(recorded) if recorded == now.start_time => Ok(Some(now)),
        // Nobody holds the lock and the pid is another process now: no daemon runs.
        Some(_) => {
            eprintln!(
                "drover: {} is stale (pid {} is another process now); it is not signalled",
                file.display(),
                info.pid
            );
            Ok(None)
        }
        None => bail!(
            "{} names pid {} without a start time and no daemon holds the home's lock: the file \
             is stale, so the pid is not signalled. Remove the file if no daemon runs",
            file.display(),
            info.pid
        ),
    }
}

/// `drover stop`: SIGTERM to the daemon (checked by pid and start time, so a recycled pid is
/// never signalled), then wait for it to exit.
pub async fn stop(home: PathBuf) -> Result<Exit> {
    let Some(target) = stop_target(&home)? else {
        eprintln!("drover: no daemon is running for {}", home.display());
        return Ok(Exit::Ok);
    };
    let pid = target.pid;
    let signalled = drover_platform::signal_process_if_same(
        pid,
        target.start_time,
        drover_platform::Signal::SIGTERM,
    )
    .with_context(|| format!("cannot signal daemon pid {pid}"))?;
    if !signalled {
        eprintln!("drover: no daemon is running for {}", home.display());
        return Ok(Exit::Ok);
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while drover_platform::process_matches(pid, target.start_time) {
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
    /// List the stored `always` rules: id, command class, scope, where each came from, age.
    List {
        /// Print JSON (`{rules: [{rule_id, pattern_key, class, scope, path?, text, origin,
        /// created_at}]}`).
        #[arg(long)]
        json: bool,
    },
    /// Remove a stored rule by its id, or every rule of a command class by its pattern key;
    /// commands they covered ask again.
    Rm {
        /// The rule's id (or a unique prefix of it), or a pattern key, as `list` shows them.
        rule: String,
    },
}

/// `drover approvals`.
pub async fn approvals(home: PathBuf, command: ApprovalsCommand) -> Result<Exit> {
    let c = connect(&home).await?;
    let list = || async {
        let raw = c
            .request_value(ClientRequest::ApprovalsList(NoParams {}))
            .await?;
        let list: ApprovalRules = drover_client::parse_result("approvals.list", raw.clone())?;
        anyhow::Ok((raw, list))
    };
    match command {
        ApprovalsCommand::List { json } => {
            let (raw, list) = list().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&raw)?);
                return Ok(Exit::Ok);
            }
            if list.rules.is_empty() {
                eprintln!("drover: no stored approval rules");
                return Ok(Exit::Ok);
            }
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            // FROM holds a whole command, of any length: it is the last column, so a long one
            // does not push the others out of line.
            println!(
                "{:<8}  {:<30}  {:<40}  {:<10}  FROM",
                "ID", "CLASS", "SCOPE", "AGE"
            );
            for r in &list.rules {
                println!(
                    "{:<8}  {:<30}  {:<40}  {:<10}  {}",
                    short_id(&r.rule_id),
                    r.class,
                    scope_words(r),
                    crate::display::ago(r.created_at, now),
                    origin_words(&r.origin)
                );
            }
            Ok(Exit::Ok)
        }
        ApprovalsCommand::Rm { rule } => {
            // A rule id (or a unique prefix of one) names one rule; anything else is a class.
            let (_, list) = list().await?;
            let matching: Vec<&ApprovalRule> = list
                .rules
                .iter()
                .filter(|r| r.rule_id.starts_with(rule.as_str()))
                .collect();
            let by_class = list.rules.iter().any(|r| r.pattern_key == rule);
            let target = match (matching.as_slice(), by_class) {
                (_, true) => ApprovalRuleRef {
                    rule_id: None,
                    pattern_key: Some(rule.clone()),
                },
                ([one], false) => ApprovalRuleRef {
                    rule_id: Some(one.rule_id.clone()),
                    pattern_key: None,
                },
                ([], false) => {
                    eprintln!("{}", no_rule_words(&rule));
                    return Ok(Exit::Failed);
                }
                (_, false) => {
                    eprintln!("drover: {rule} is the start of several rule ids; give more of it");
                    return Ok(Exit::Failed);
                }
            };
            let r: ApprovalRuleRemoved = c
                .request(ClientRequest::ApprovalsRemove(target.clone()))
                .await?;
            match (r.removed, matching.as_slice(), by_class) {
                (true, [one], false) => eprintln!(
                    "drover: removed the rule \"always allow {}\" ({}); those commands ask again",
                    one.text,
                    short_id(&one.rule_id)
                ),
                (true, _, _) => {
                    let class = list
                        .rules
                        .iter()
                        .find(|r| r.pattern_key == rule)
                        .map_or(rule.as_str(), |r| r.class.as_str());
                    eprintln!(
                        "drover: removed every `always` rule of the class \"{class}\" (any scope); those commands ask again"
                    )
                }
                (false, _, _) => {
                    eprintln!("{}", no_rule_words(&rule));
                    return Ok(Exit::Failed);
                }
            }
            Ok(Exit::Ok)
        }
    }
}

/// What `drover approvals rm` says when nothing matched `rule`.
fn no_rule_words(rule: &str) -> String {
    format!(
        "drover: no stored `always` rule has an id starting with {rule:?} (nor is it a class's pattern key); `drover approvals list` shows the ids"
    )
}

/// The first 8 characters of a rule id: enough to name it in `drover approvals rm`.
fn short_id(id: &str) -> &str {
    id.get(..8).unwrap_or(id)
}

/// A rule's scope for the table: `everywhere`, or the scope and its tree.
fn scope_words(r: &ApprovalRule) -> String {
    match &r.path {
        Some(path) => format!("{} {}", r.scope, path),
        None => r.scope.to_string(),
    }
}

/// Where a rule came from: its session (short) and the command it was asked about, or `-`
/// for a rule stored before rules kept their origin.
fn origin_words(origin: &ApprovalRuleOrigin) -> String {
    match (&origin.session_id, &origin.command) {
        (Some(session), Some(command)) => {
            format!("{} {}", short_id(session), printable(command))
        }
        (Some(session), None) => short_id(session).to_string(),
        _ => "-".to_string(),
    }
}
