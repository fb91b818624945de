//! Test support for drover's end-to-end tests and benchmarks.
//!
//! - [`mock_model`]: a loopback, scriptable OpenAI-compatible model server (stream and
//!   non-stream, tool calls, usage, gates that hold a response, a request log).
//! - [`harness`]: starts the real `drover` binary on a temporary home and speaks the real
//!   WebSocket JSON-RPC to it, with a timeout on every wait; the shared set-ups of the
//!   end-to-end tests (`OneSession` and its builder, `model_home`, `model_daemon`,
//!   `run_drover`, `Lines`), one module per thing it drives (home, daemon, rpc, processes,
//!   state.db, mosquitto).
//! - [`job_cli`]: the clean environment, bounded runs and registry reads (`JobCli`) of the
//!   `drover job` tests.
//! - [`mcp_echo`]: where the `drover-mcp-echo` fixture is, a real stdio MCP server (built with
//!   the official SDK) with tools `echo`, `add`, `fail` and `crash`; and where the
//!   `drover-worker-relay` fixture is, a `$DROVER_WORKER_EXE` wrapper that can send one
//!   forged frame; and where `drover-test-agent` is, a scripted ACP agent (a JSON script:
//!   say, ask permission, call a tool, hang, exit). `drover-agent-setup` prints the
//!   `[agents.<name>]` entry of a real agent ([`agents`]) on a mock model, for the Python tests.
//! - [`wait`]: bounded waits: [`wait::until`] a condition holds, [`wait::holds_for`] a window,
//!   [`wait::file`] a file a child writes holds what the test reads from it.
//! - [`tmux`]: a real terminal, `drover` in a pane of a private tmux server ([`tmux::Pane`]:
//!   its screen, keys, bounded waits on the screen, drover's pid and exit code).
//! - [`bench`]: a benchmark's size from its variable ([`env_count`]); what the benchmarks
//!   measure beside drover (the disk's floor for a durable write, the ledger's times of each
//!   admission).
//! - [`outside_path`] (in `harness::home`): a fresh path outside every sandbox root, for the
//!   sandbox tests.
//! - [`acp`]: real third-party ACP clients for `drover acp` (acpx, and a client on the
//!   official TypeScript SDK), on the Node of `tests/acp/node_modules`.
//! - [`agents`]: real third-party ACP agents (Codex through codex-acp, OpenCode) from
//!   `tests/agents/node_modules`, configured to talk only to a [`MockModel`], and the model
//!   replies that call their shell tools ([`shell_call`]).
//! - [`flip`]: a file flipped with a symlink while a tool opens it ([`flip::Flipper`]).
//! - [`tls_front`]: a model endpoint behind TLS whose certificate comes from a CA made in the
//!   test ([`tls_front::TestCa`], [`tls_front::TlsFront`] in front of a [`MockModel`]).
//! - [`tinyproxy`]: a private tinyproxy, a real HTTP CONNECT proxy, with its log.
//! - [`alone`]: a test that must be alone in its process (working directory, process-wide
//!   sets, a panic hook) runs again as the only test of a child process of its test binary.
//!
//! Nothing here mocks a drover component: only the model is played.
//!
//! Layers: `mock_model`, `mcp_echo`, `wait`, `alone`, `flip`, `tls_front`, `tinyproxy`
//! (leaves); `agents` (on `mock_model`); `harness` (on `wait`); `tmux`, `bench` and `acp` on
//! top.

// Test code only: a helper that cannot set up its fixture (a port, a temporary folder, a
// missing mosquitto) panics with a message, which fails the calling test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod acp;
pub mod agents;
pub mod alone;
pub mod bench;
pub mod flip;
pub mod harness;
pub mod job_cli;
pub mod mcp_echo;
pub mod mock_model;
pub mod tinyproxy;
pub mod tls_front;
pub mod tmux;
pub mod wait;

pub use agents::{shell_call, AgentKit, AgentSetup};
pub use bench::env_count;
pub use harness::home::outside_path;
pub use mcp_echo::{mcp_echo_bin, mock_model_bin, worker_relay_bin};
pub use mock_model::{Gate, MockModel, Reply};
