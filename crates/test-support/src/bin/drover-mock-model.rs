//! `drover-mock-model`: the loopback model server as a program, for the README demo and for
//! trying drover without a real endpoint.
//!
//! It prints its base URL on stdout, then answers forever: a request whose last message is from
//! the user gets a `terminal` tool call running `uname -sr`, or the command after `run:` when
//! the message starts with it (`run: rm -rf /tmp/x`, to try approvals); a request whose last
//! message is a tool result gets a text answer quoting that result. Chat completions and the
//! Responses API are answered alike. Stop it with SIGTERM or Ctrl-C. `--help` prints the usage
//! and exits; it takes no other argument.

use drover_test_support::mock_model::{last_message, messages};
use drover_test_support::{MockModel, Reply};
use serde_json::{json, Value};

const USAGE: &str = "\
usage: drover-mock-model

A loopback model server for trying drover without a real endpoint. It prints its base URL, then
answers until SIGTERM or Ctrl-C: a user message gets a `terminal` tool call running `uname -sr`
(or the command after `run:`, e.g. `run: rm -rf /tmp/x` to try approvals); a tool result gets a
text answer quoting it.

  drover run --base-url URL --model demo \"run: ls\"

Options:
  -h, --help  print this help and exit
";

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    // It takes no arguments: `--help` (or anything else) must not leave a server running.
    if let Some(arg) = std::env::args().nth(1) {
        if arg == "--help" || arg == "-h" {
            print!("{USAGE}");
            return std::process::ExitCode::SUCCESS;
        }
        eprint!("drover-mock-model: unexpected argument {arg:?}\n\n{USAGE}");
        return std::process::ExitCode::FAILURE;
    }
    let model = MockModel::start().await;
    model.set_responder(|req: &Value| {
        let last = last_message(req);
        if last["role"] == "tool" {
            let content = last["content"].as_str().unwrap_or_default();
            let output = serde_json::from_str::<Value>(content)
                .ok()
                .and_then(|v| v["output"].as_str().map(str::to_string))
                .unwrap_or_else(|| content.to_string());
            Reply::text(format!("The command printed: {}", output.trim()))
        } else {
            let n = messages(req).len();
            let asked = last["content"].as_str().unwrap_or_default().trim();
            let command = asked
                .strip_prefix("run:")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .unwrap_or("uname -sr");
            Reply::tool_call(format!("call_{n}"), "terminal", json!({"command": command}))
        }
    });
    println!("{}", model.base_url());
    let _ = tokio::signal::ctrl_c().await;
    std::process::ExitCode::SUCCESS
}
