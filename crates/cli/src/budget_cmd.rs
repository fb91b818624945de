//! `drover budget`: a session's (or the home's daily) spend against its limits; raising a
//! limit resumes every turn paused under it, and `--stop` ends a paused turn `interrupted`
//! (docs/configuration.md, "Budgets").

use std::path::Path;

use anyhow::{bail, Context, Result};
use clap::Args;
use drover_protocol::client::{
    BudgetChoice, BudgetRaiseParams, BudgetRespondParams, BudgetStatus, BudgetStatusParams,
    OpenPrompt, PromptResponse, PromptResponseStatus,
};
use drover_protocol::ClientRequest;

use crate::session_cmd::limit_words;
use crate::Exit;

/// `drover budget [ID | --home] [--add-usd X] [--add-tokens N] [--stop] [--json]` arguments.
#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("whose").required(true).args(["session", "home_wide"])))]
pub struct BudgetArgs {
    /// The session: its id, or any unique prefix of it (a child agent's session shows and
    /// raises its root parent's budget).
    session: Option<String>,
    /// The home-wide daily limit (`[budget] home_usd_per_day`) instead of a session's.
    #[arg(long = "home-wide", conflicts_with = "session")]
    home_wide: bool,
    /// Raise the USD limit by this much.
    #[arg(long, value_name = "USD")]
    add_usd: Option<f64>,
    /// Raise the token limit by this many (a session's only).
    #[arg(long, value_name = "N")]
    add_tokens: Option<u64>,
    /// Stop the session's turn paused by a limit: it ends `interrupted`, without the request.
    #[arg(long, conflicts_with_all = ["add_usd", "add_tokens", "home_wide"])]
    stop: bool,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// `drover budget`.
pub async fn budget(home: &Path, args: BudgetArgs) -> Result<Exit> {
    crate::session_cmd::require_home(home)?;
    let c = crate::commands::connect(home).await?;
    let session_id = match &args.session {
        Some(prefix) => Some(c.resolve_session(prefix).await?.session_id),
        None => None,
    };
    if args.stop {
        let Some(sid) = session_id else {
            bail!("--stop names a session");
        };
        let snapshot = c.resume(&sid).await?;
        let Some(OpenPrompt::Budget(prompt)) = snapshot
            .prompts
            .iter()
            .find(|p| matches!(p, OpenPrompt::Budget(_)))
        else {
            bail!("no turn of session {sid} is paused by a spend limit");
        };
        let response: PromptResponse = c
            .request(ClientRequest::BudgetRespond(BudgetRespondParams {
                session_id: sid.clone(),
                execution_generation: prompt.execution_generation,
                prompt_id: prompt.prompt_id.clone(),
                choice: BudgetChoice::Stop,
                add_usd: None,
                add_tokens: None,
            }))
            .await?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&response)?);
        } else {
            match response.status {
                PromptResponseStatus::Resolved => println!(
                    "stopped the turn of session {sid} paused by a spend limit: it ends interrupted, its request never sent"
                ),
                PromptResponseStatus::AlreadyResolved => println!(
                    "the pause of session {sid} was already answered (by another client); nothing changed"
                ),
                PromptResponseStatus::Cancelled => println!(
                    "the pause of session {sid} had already ended ({}); nothing changed",
                    response.reason.as_deref().unwrap_or("the turn ended")
                ),
            }
        }
        return Ok(Exit::Ok);
    }
    let raising = args.add_usd.is_some() || args.add_tokens.is_some();
    let status: BudgetStatus = if raising {
        c.request(ClientRequest::BudgetRaise(BudgetRaiseParams {
            session_id,
            add_usd: args.add_usd,
            add_tokens: args.add_tokens,
        }))
        .await
        .context("raising the limit")?
    } else {
        c.request(ClientRequest::BudgetStatus(BudgetStatusParams {
            session_id,
        }))
        .await?
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&status)?);
        return Ok(Exit::Ok);
    }
    let whose = match &status.session_id {
        // The 8 characters every command takes and prints for a session.
        Some(id) => format!("session {}", id.get(..8).unwrap_or(id)),
        None => "the home today (UTC)".to_string(),
    };
    let limit = match (&status.session_id, status.limit_usd, status.limit_tokens) {
        (Some(id), None, None) => format!(
            "no limit (`drover budget {} --add-usd X` gives it one, X more than it has spent)",
            id.get(..8).unwrap_or(id)
        ),
        (_, usd, tokens) => format!("limit {}", limit_words(usd, tokens)),
    };
    println!(
        "{whose}: {:.4} USD, {} tokens spent; {limit}",
        status.spent_usd, status.spent_tokens
    );
    if raising && (status.resumed > 0 || status.paused > 0) {
        println!("resumed {} paused turn(s)", status.resumed);
    }
    if status.paused > 0 {
        println!("{} turn(s) still paused (budget)", status.paused);
    }
    Ok(Exit::Ok)
}
