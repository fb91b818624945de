//! `drover acp`: drover as an Agent Client Protocol agent on stdio, for editors (docs/acp.md).
//! A client of the home's daemon, started if none runs, as `drover run` does.

use std::path::PathBuf;

use crate::Exit;
use anyhow::{Context, Result};
use drover_client::{ConnectOptions, StartDaemon};

/// How long the ACP agent keeps trying to reach a daemon that went away (a restart, an
/// upgrade) before it gives up on a session: an editor stays open for days.
const ACP_RECONNECT_FOR: std::time::Duration = std::time::Duration::from_secs(600);

/// Serves the ACP client on stdin/stdout until it closes them. Stdout carries only protocol
/// messages: everything else goes to stderr.
pub async fn acp(home: PathBuf) -> Result<Exit> {
    let program = std::env::current_exe().context("cannot find the drover executable")?;
    let mut options = ConnectOptions::new(home, StartDaemon::Spawn { program });
    options.reconnect_for = ACP_RECONNECT_FOR;
    drover_acp::serve(drover_acp::Transport::Stdio, options).await?;
    Ok(Exit::Ok)
}
