//! `drover-agent-setup`: one real agent of `tests/agents` set up against a scriptable mock
//! model, for tests that are not written in Rust (the Python client's). The same set-up as
//! [`AgentKit::codex`] / [`AgentKit::opencode`], so those tests do not keep a copy of it.
//!
//! `drover-agent-setup codex|opencode DIR`: writes the agent's homes and configuration under
//! `DIR`, starts a [`MockModel`] on loopback (chat completions and the Responses API), and
//! prints one JSON line on stdout: `{"name", "base_url", "config_toml"}` (`config_toml` is the
//! `[agents.<name>]` entry for drover's `config.toml`). Then each line read on stdin is one
//! reply appended to the model's script, answered by a line `{"pushed": N}` once it is in:
//! `{"text": "..."}` a text answer, `{"shell": "COMMAND"}` a call of the agent's own shell tool
//! asking for permission ([`shell_call`]). With the script empty the model answers `ok`. The
//! program ends at the end of its stdin. When the npm packages are missing it prints why on
//! stderr and exits with code 2 before writing anything on stdout.

use std::path::PathBuf;
use std::process::ExitCode;

use drover_test_support::{shell_call, AgentKit, MockModel, Reply};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// The exit code when the agents are not installed, so a caller can tell it from a failure.
const NOT_INSTALLED: u8 = 2;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [agent, dir] = args.as_slice() else {
        eprintln!("usage: drover-agent-setup codex|opencode DIR");
        return ExitCode::FAILURE;
    };
    if let Err(why) = AgentKit::find() {
        eprintln!("{why}");
        return ExitCode::from(NOT_INSTALLED);
    }
    let dir = PathBuf::from(dir);
    let model = MockModel::start().await;
    let setup = match agent.as_str() {
        "codex" => AgentKit::codex(&dir, &model.base_url()),
        "opencode" => AgentKit::opencode(&dir, &model.base_url()),
        other => {
            eprintln!("unknown agent {other:?}: codex or opencode");
            return ExitCode::FAILURE;
        }
    };
    let Some(setup) = setup else {
        return ExitCode::from(NOT_INSTALLED);
    };
    let mut stdout = tokio::io::stdout();
    let hello = json!({
        "name": setup.name, "base_url": model.base_url(), "config_toml": setup.config_toml,
    });
    if say(&mut stdout, &hello).await.is_err() {
        return ExitCode::FAILURE;
    }
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut pushed = 0u64;
    loop {
        let line = match lines.next_line().await {
            Ok(Some(line)) => line,
            Ok(None) => return ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("reading stdin: {e}");
                return ExitCode::FAILURE;
            }
        };
        let step: Value = match serde_json::from_str(&line) {
            Ok(step) => step,
            Err(e) => {
                eprintln!("not a JSON line ({e}): {line}");
                return ExitCode::FAILURE;
            }
        };
        let reply = if let Some(text) = step["text"].as_str() {
            Reply::text(text)
        } else if let Some(command) = step["shell"].as_str() {
            shell_call(&setup, command)
        } else {
            eprintln!("a step is {{\"text\": ...}} or {{\"shell\": ...}}, not {line}");
            return ExitCode::FAILURE;
        };
        model.push(reply);
        pushed += 1;
        if say(&mut stdout, &json!({"pushed": pushed})).await.is_err() {
            return ExitCode::FAILURE;
        }
    }
}

/// Writes `line` and a newline on stdout and flushes, so the caller reads it at once.
async fn say(stdout: &mut tokio::io::Stdout, line: &Value) -> std::io::Result<()> {
    let written = async {
        stdout.write_all(format!("{line}\n").as_bytes()).await?;
        stdout.flush().await
    }
    .await;
    if let Err(e) = &written {
        eprintln!("writing stdout: {e}");
    }
    written
}
