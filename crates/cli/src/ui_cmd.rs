//! `drover ui` (SPEC section 8): print, and open when a browser is there, a one-time
//! login link to the daemon's web dashboard at `/ui`.
//!
//! The code comes from `ui.login_code` over this command's bearer-token connection (the daemon
//! is started when none runs, as for `drover run`). It works once, within 60 seconds, and the
//! cookie it is exchanged for ends with this daemon start (docs/dashboard.md).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use drover_protocol::client::{NoParams, UiLoginCode};
use drover_protocol::ClientRequest;

use crate::Exit;

/// `drover ui`'s flags.
#[derive(Args, Debug, Default)]
pub struct UiArgs {
    /// Only print the link; do not start a browser.
    #[arg(long)]
    pub no_open: bool,
    /// Print `{url, expires_in_s}` as JSON instead of the bare link.
    #[arg(long)]
    pub json: bool,
}

/// How long `xdg-open` may take to hand the link over before this command stops waiting.
const OPENER_WAIT: Duration = Duration::from_secs(5);

/// `drover ui`.
pub async fn ui(home: PathBuf, args: UiArgs) -> Result<Exit> {
    let c = crate::commands::connect(&home).await?;
    let login: UiLoginCode = c.request(ClientRequest::UiLoginCode(NoParams {})).await?;
    let url = login.url.expose();
    if args.json {
        let shown = serde_json::json!({"url": url, "expires_in_s": login.expires_in_s});
        println!("{}", serde_json::to_string_pretty(&shown)?);
    } else {
        println!("{url}");
        eprintln!(
            "drover: the link logs one browser in; it works once, within {} s",
            login.expires_in_s
        );
    }
    if !args.no_open && graphical_session() {
        open_in_browser(url).await;
    }
    Ok(Exit::Ok)
}

/// Whether a browser could show a page here: an X or Wayland display.
fn graphical_session() -> bool {
    ["DISPLAY", "WAYLAND_DISPLAY"]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|s| !s.is_empty()))
}

/// Hands `url` to `xdg-open`, waiting a bounded time; a missing or failing opener is only a
/// note (the link is printed either way).
async fn open_in_browser(url: &str) {
    let child = tokio::process::Command::new("xdg-open")
        .arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(false)
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            eprintln!("drover: could not start xdg-open ({e}); open the link by hand");
            return;
        }
    };
    match tokio::time::timeout(OPENER_WAIT, child.wait()).await {
        Ok(Ok(status)) if status.success() => {}
        Ok(Ok(status)) => eprintln!("drover: xdg-open failed ({status}); open the link by hand"),
        Ok(Err(e)) => eprintln!("drover: xdg-open failed ({e}); open the link by hand"),
        Err(_) => eprintln!(
            "drover: xdg-open is still running; open the link by hand if no browser showed it"
        ),
    }
}
