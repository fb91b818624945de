//! `drover acp`: drover as an Agent Client Protocol agent on stdio, for editors (docs/acp.md).
//! A client of the home's daemon, started if none runs, as `drover run` does.

use std::path::PathBuf;

use crate::Exit;
use anyhow::{bail, Context, Result};
use clap::Args;
use drover_client::{ConnectOptions, StartDaemon};

/// `drover acp` arguments.
#[derive(Args, Debug, Default)]
pub struct AcpArgs {
    /// Every session the editor creates runs this external agent, a name of `[agents.<name>]`
    /// in config.toml, instead of drover's own agent loop; the editor's session list shows only
    /// that agent's sessions.
    #[arg(long, value_name = "NAME")]
    agent: Option<String>,
}

/// How long the ACP agent keeps trying to reach a daemon that went away (a restart, an
/// upgrade) before it gives up on a session: an editor stays open for days.
const ACP_RECONNECT_FOR: std::time::Duration = std::time::Duration::from_secs(600);

/// Serves the ACP client on stdin/stdout until it closes them. Stdout carries only protocol
/// messages: everything else goes to stderr.
pub async fn acp(home: PathBuf, args: AcpArgs) -> Result<Exit> {
    let _ = drover_platform::set_process_title("drover acp");
    if args.agent.as_deref().is_some_and(|a| a.trim().is_empty()) {
        bail!("--agent must name an agent of [agents.<name>] in config.toml, not be empty");
    }
    let program = std::env::current_exe().context("cannot find the drover executable")?;
    let mut options = ConnectOptions::new(home, StartDaemon::Spawn { program });
    options.reconnect_for = ACP_RECONNECT_FOR;
    let new_sessions = drover_acp::NewSessions { agent: args.agent };
    drover_acp::serve(drover_acp::Transport::Stdio, options, new_sessions).await?;
    Ok(Exit::Ok)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Parsed {
        #[command(flatten)]
        args: AcpArgs,
    }

    #[test]
    fn agent_is_optional() {
        let parsed = Parsed::try_parse_from(["acp", "--agent", "opencode"]).unwrap();
        assert_eq!(parsed.args.agent.as_deref(), Some("opencode"));
        assert_eq!(Parsed::try_parse_from(["acp"]).unwrap().args.agent, None);
    }
}
