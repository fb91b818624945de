//! `drover restart`: the binary on disk becomes the home's next owner and adopts the running
//! turns (SPEC section 9, daemon handoff; docs/restart.md). The daemon does the handoff
//! (`daemon.restart`); this command asks for it and says how it went.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use drover_client::{Client, ConnectOptions, StartDaemon};
use drover_protocol::client::{RestartParams, Restarted};
use drover_protocol::ClientRequest;

use crate::Exit;

/// `drover restart`.
#[derive(Args, Debug, Default)]
pub struct RestartArgs {
    /// Stop starting turns, let the running ones finish, then hand over (for a next build whose
    /// worker protocol differs). Inputs sent meanwhile are kept, queued, for the next owner.
    #[arg(long)]
    pub drain: bool,
    /// With `--drain`: give up (and keep the old owner serving) after this many seconds.
    #[arg(long, value_name = "S", requires = "drain")]
    pub timeout: Option<f64>,
    /// The drover binary to hand over to (default: the daemon's own path on disk, where an
    /// upgrade put the new build).
    #[arg(long, value_name = "PATH")]
    pub binary: Option<PathBuf>,
}

/// `drover restart`.
pub async fn restart(home: PathBuf, args: RestartArgs) -> Result<Exit> {
    if drover_client::read_daemon_info(&home).is_none() && drover_client::owner_pid(&home).is_none()
    {
        eprintln!("drover: no daemon is running for {}", home.display());
        return Ok(Exit::Ok);
    }
    let binary = match args.binary {
        Some(path) => Some(
            std::path::absolute(&path)
                .with_context(|| format!("--binary {}", path.display()))?
                .to_string_lossy()
                .into_owned(),
        ),
        None => None,
    };
    let client = Client::connect(ConnectOptions::new(&home, StartDaemon::Never))
        .await
        .context("cannot reach the daemon")?;
    let params = RestartParams {
        drain: args.drain,
        timeout_s: args.timeout,
        binary,
    };
    if args.drain {
        eprintln!("drover: draining: no new turn starts; waiting for the running ones to end");
    }
    let done: Restarted = match client.request(ClientRequest::DaemonRestart(params)).await {
        Ok(done) => done,
        Err(e) => {
            eprintln!("drover: the restart did not happen; the daemon goes on as it was: {e}");
            return Ok(Exit::Failed);
        }
    };
    eprintln!(
        "drover: daemon restarted (version {} -> {}): pid {}, epoch {}, {} running turn(s) adopted",
        done.from_version, done.to_version, done.pid, done.epoch, done.adopted
    );
    Ok(Exit::Ok)
}
