//! `drover run` (SPEC section 8): pick or create the session, refuse a session that cannot
//! move (paused on an `unknown` turn: exit 4; an open prompt nobody here can answer: exit 5),
//! submit, and follow the turn through [`drover_client::SessionStream`] until it settles,
//! across a daemon that dies and is started again.

use std::io::Read;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use drover_client::{Client, ClientError, SessionStream};
use drover_protocol::client::{AdmissionStatus, SessionCreateParams, SessionSnapshot};

use crate::commands::connect;
use crate::Exit;

mod answer;
mod follow;
mod output;

use answer::{answer_prompt, Answered, Flags};
use follow::Turn;
use output::Output;

/// `drover run` arguments (SPEC section 8).
#[derive(Args, Debug)]
pub struct RunArgs {
    /// Continue this session (its id, or any unique prefix of it).
    #[arg(long, value_name = "ID", conflicts_with = "continue_")]
    session: Option<String>,
    /// Continue the home's most recent session.
    #[arg(short = 'c', long = "continue")]
    continue_: bool,
    /// Model name for a new session (default: [model] name).
    #[arg(long)]
    model: Option<String>,
    /// Model endpoint for a new session (default: [model] base_url or $OPENAI_BASE_URL).
    #[arg(long = "base-url", value_name = "URL")]
    base_url: Option<String>,
    /// The new session's turns run this external agent, a name of `[agents.<name>]` in
    /// config.toml, instead of drover's own agent loop.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["session", "continue_"])]
    agent: Option<String>,
    /// A title for the new session (`drover sessions` shows it).
    #[arg(long, value_name = "T", conflicts_with_all = ["session", "continue_"])]
    title: Option<String>,
    /// The new session's spend limit in USD (default: [budget] session_usd); its turns pause
    /// before a request that would pass it (`drover budget` raises it).
    #[arg(long, value_name = "USD", conflicts_with_all = ["session", "continue_"])]
    budget: Option<f64>,
    /// The new session's token limit, input + output (default: [budget] session_tokens).
    #[arg(long, value_name = "N", conflicts_with_all = ["session", "continue_"])]
    budget_tokens: Option<u64>,
    /// Print one JSON line per event (as the wire has it), then the receipt, on stdout.
    #[arg(long)]
    json: bool,
    /// Answer approval prompts with this choice when there is no terminal.
    #[arg(long, value_parser = ["once", "session", "deny"])]
    approve: Option<String>,
    /// Answer clarify questions with this text when there is no terminal.
    #[arg(long, value_name = "TEXT")]
    answer: Option<String>,
    /// The prompt; `-` reads it from stdin.
    prompt: String,
}

/// `drover run`.
pub async fn run(home: PathBuf, args: RunArgs) -> Result<Exit> {
    let text = prompt_text(&args.prompt)?;
    // Ctrl-C is ours from here on: one pressed before the turn is followed still interrupts
    // it (the stream keeps it), and none kills the client with the turn left running.
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .context("cannot take Ctrl-C")?;
    refuse_a_new_session_without_a_model(&home, &args, &text)?;
    let client = connect(&home).await?;
    if let Some(mismatch) = client.api_key_mismatch() {
        eprintln!("drover: {mismatch}");
    }
    let mut stream = open_session(&client, &home, &args).await?;
    let session_id = stream.session_id().to_string();
    eprintln!("drover: session {session_id}");
    let mut out = Output::new(args.json);
    if let Some(code) = refuse_stuck(&client, &mut stream, &args, &mut out).await? {
        return Ok(code);
    }
    let receipt = client.submit(&session_id, &text).await?;
    let mut turn = Turn {
        client: &client,
        session_id,
        admission_id: receipt.admission_id.clone(),
        generation: None,
        mine: false,
        interrupts: 0,
        awaiting_approval: false,
        children: None,
        flags: Flags::from(&args),
        out,
        streamed: Default::default(),
    };
    let end = turn.follow(&mut stream, &mut sigint).await;
    if let Some(children) = turn.children.take() {
        children.on.store(false, Ordering::Relaxed);
    }
    end
}

/// A new session needs a model name: without `--model` or `[model] name`, say so before a
/// daemon is started for nothing (the daemon would refuse `session.create` the same way).
/// A config that does not load is left to the daemon, which names what is wrong.
/// An empty `--model`, a `--base-url` that is not http(s), and a prompt over `[daemon]
/// max_input_bytes` are refused here too, before a session is made for nothing.
fn refuse_a_new_session_without_a_model(
    home: &std::path::Path,
    args: &RunArgs,
    text: &str,
) -> Result<()> {
    if args.model.as_deref().is_some_and(|m| m.trim().is_empty()) {
        bail!("--model must name a model, not be empty");
    }
    if args.agent.as_deref().is_some_and(|a| a.trim().is_empty()) {
        bail!("--agent must name an agent of [agents.<name>] in config.toml, not be empty");
    }
    if let Some(url) = &args.base_url {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            bail!("--base-url {url:?} must start with http:// or https://");
        }
    }
    // A config that does not load is left to the daemon, which names what is wrong.
    let Ok(config) = drover_owner::config::Config::load(home) else {
        return Ok(());
    };
    let limit = config.daemon.max_input_bytes;
    if text.len() as u64 > limit {
        bail!(
            "the prompt is {} bytes, over [daemon] max_input_bytes = {limit}",
            text.len()
        );
    }
    // An external agent picks its own model, so whether the session needs drover's is the
    // daemon's to say.
    let new_session =
        args.session.is_none() && !args.continue_ && args.model.is_none() && args.agent.is_none();
    if new_session && config.model.name.as_deref().is_none_or(str::is_empty) {
        bail!(
            "no model: pass --model NAME or set [model] name in {}",
            home.join("config.toml").display()
        );
    }
    Ok(())
}

/// The prompt argument, or stdin for `-`.
fn prompt_text(arg: &str) -> Result<String> {
    if arg != "-" {
        if arg.trim().is_empty() {
            bail!("the prompt is empty");
        }
        return Ok(arg.to_string());
    }
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .context("cannot read the prompt from stdin")?;
    let text = text.trim_end_matches(['\n', '\r']).to_string();
    if text.trim().is_empty() {
        bail!("the prompt from stdin is empty");
    }
    Ok(text)
}

/// `--session` (exact id, else a unique prefix), `-c`, or a new session; attached.
async fn open_session(
    client: &Client,
    home: &std::path::Path,
    args: &RunArgs,
) -> Result<SessionStream> {
    if let Some(given) = &args.session {
        // A whole id needs no listing (and a prefix is never a whole id of another).
        match client.attach(given).await {
            Ok(stream) => return Ok(stream),
            Err(e) if e.reason() == Some("not_found") => {}
            Err(e) => return Err(e.into()),
        }
        let session = client.resolve_session(given).await?;
        return Ok(client.attach(&session.session_id).await?);
    }
    if args.continue_ {
        let session = client.most_recent_session().await?;
        return Ok(client.attach(&session.session_id).await?);
    }
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    let cwd = cwd
        .to_str()
        .ok_or_else(|| anyhow!("the current directory {} is not UTF-8", cwd.display()))?;
    // `$OPENAI_BASE_URL` of this command fills what config.toml leaves out (SPEC section 1);
    // the daemon may have been started from another environment.
    let base_url = args.base_url.clone().or_else(|| {
        drover_owner::config::Config::load(home)
            .ok()
            .and_then(|c| c.base_url())
    });
    client
        .create_and_attach(SessionCreateParams {
            model: args.model.clone(),
            base_url,
            title: args.title.clone(),
            agent: args.agent.clone(),
            source: Some("cli".into()),
            budget: (args.budget.is_some() || args.budget_tokens.is_some()).then(|| {
                Box::new(drover_protocol::client::SessionBudget {
                    usd: args.budget,
                    tokens: args.budget_tokens,
                })
            }),
            ..SessionCreateParams::in_cwd(uuid::Uuid::new_v4().to_string(), cwd.to_string())
        })
        .await
        .map_err(|e| explain_create_error(e, home))
}

/// `session.create` errors in the words of `drover run`'s flags.
fn explain_create_error(e: ClientError, home: &std::path::Path) -> anyhow::Error {
    let config = home.join("config.toml");
    let missing = e.to_string().contains("no model endpoint");
    match e.field() {
        Some("base_url") if missing => anyhow!(
            "no model endpoint: pass --base-url URL, set [model] base_url in {}, or set $OPENAI_BASE_URL",
            config.display()
        ),
        Some("model") => anyhow!(
            "no model: pass --model NAME or set [model] name in {}",
            config.display()
        ),
        // The daemon's sentence names the agents config.toml has.
        Some("agent") => match e.rpc() {
            Some(rpc) => anyhow!("--agent: {rpc}"),
            None => e.into(),
        },
        _ => e.into(),
    }
}

/// Before submitting: a session paused on an `unknown` turn runs nothing new (exit 4 naming
/// `drover resolve`); an open prompt is answered here when it can be, else exit 5 naming
/// `drover answer`.
async fn refuse_stuck(
    client: &Client,
    stream: &mut SessionStream,
    args: &RunArgs,
    out: &mut Output,
) -> Result<Option<Exit>> {
    let snapshot: SessionSnapshot = stream.snapshot().clone();
    let id = &snapshot.session_id;
    if let Some(lost) = snapshot
        .pending
        .iter()
        .find(|p| p.status == AdmissionStatus::Unknown)
    {
        eprintln!(
            "drover: session {id} is paused on an unknown turn: admission {} ({}) was running \
             when its worker or the daemon died, and its outcome is unknown; nothing runs \
             until `drover resolve {id}` closes it",
            lost.admission_id,
            quote(&lost.text)
        );
        return Ok(Some(Exit::Unknown));
    }
    for prompt in &snapshot.prompts {
        match answer_prompt(client, id, prompt, &Flags::from(args), out).await? {
            Answered::Sent => {}
            Answered::Left(code) => return Ok(Some(code)),
        }
    }
    Ok(None)
}

/// A prompt's input, quoted and cut for one line.
fn quote(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default();
    let cut: String = line.chars().take(60).collect();
    if cut.len() < text.len() {
        format!("{cut:?}...")
    } else {
        format!("{cut:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Parsed {
        #[command(flatten)]
        args: RunArgs,
    }

    fn parse(line: &[&str]) -> Result<RunArgs, clap::Error> {
        Parsed::try_parse_from(std::iter::once("run").chain(line.iter().copied())).map(|p| p.args)
    }

    #[test]
    fn agent_names_the_new_sessions_agent() {
        let args = parse(&["--agent", "codex", "--title", "t", "hi"]).unwrap();
        assert_eq!(args.agent.as_deref(), Some("codex"));
        assert_eq!(parse(&["hi"]).unwrap().agent, None);
        // An existing session runs the agent it was made with.
        for other in [&["-c"][..], &["--session", "ab12"]] {
            let line: Vec<&str> = ["--agent", "codex"]
                .iter()
                .chain(other)
                .chain(&["hi"])
                .copied()
                .collect();
            let e = parse(&line).unwrap_err();
            assert_eq!(e.kind(), clap::error::ErrorKind::ArgumentConflict, "{e}");
        }
    }

    #[test]
    fn an_agent_session_needs_no_model_of_drover_but_an_empty_agent_is_refused() {
        let home = tempfile::tempdir().unwrap();
        let no_model = parse(&["hi"]).unwrap();
        let e = refuse_a_new_session_without_a_model(home.path(), &no_model, "hi").unwrap_err();
        assert!(e.to_string().contains("no model"), "{e}");
        let agent = parse(&["--agent", "codex", "hi"]).unwrap();
        refuse_a_new_session_without_a_model(home.path(), &agent, "hi").unwrap();
        let empty = parse(&["--agent", " ", "hi"]).unwrap();
        let e = refuse_a_new_session_without_a_model(home.path(), &empty, "hi").unwrap_err();
        assert!(e.to_string().contains("--agent"), "{e}");
    }
}
