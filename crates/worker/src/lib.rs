//! The managed worker (SPEC section 4): one process per turn, spawned by the owner as
//! `drover worker`, speaking JSON lines on stdin/stdout.
//!
//! It reads the bootstrap frame, runs the agent loop, and persists every write as a
//! sequence-numbered `persist` frame through its [`journal`] (an outbox under
//! `<home>/outbox/<execution_id>/`, written durably before each send). It never opens
//! `state.db`. It stops at once when the owner is gone (`PR_SET_PDEATHSIG`, EOF on stdin),
//! killing its tools' process groups. A daemon handoff is not a loss: told `handoff`, the
//! worker drops its parent-death signal and holds its output, its turn going on, until the
//! next owner (which took over its pipes) says `adopted`; only a handoff not adopted within its
//! grace period is the owner gone.
//!
//! Started ahead: the owner may start a worker before it has a turn for it (the
//! spare). Before the bootstrap a worker does only what does not depend on the turn (owner-loss
//! checks, the async runtime, the model's HTTP client: [`Prepared`]) and is named
//! [`SPARE_NAME`]; once the bootstrap arrived it is [`WORKER_NAME`] and serves that one turn.
//! `ps` shows its title (SPEC section 9): [`TEMPLATE_TITLE`], [`SPARE_TITLE`], then
//! [`worker_title`] once the bootstrap's head names the turn.
//!
//! Confinement: the worker makes itself non-dumpable at start, so no tool can read
//! its `/proc/<pid>/environ`, `mem` or `fd`, and hands the tools the session's sandbox
//! (`policy.sandbox` plus its temp dir, [`drover_tools::sandbox::Sandbox`]), which confines
//! every process they start.
//!
//! Forked: the owner may instead start one worker template (`drover worker
//! --template`, [`template_entry`]) that does the start-up once and forks each spare as the
//! owner's child ([`worker_template`]); a forked spare goes on exactly as an exec'd one.
//!
//! Modules:
//! - [`exit`]: how the process ends ([`WorkerExit`], its exit codes).
//! - [`journal`]: the outbox files (record, acknowledge, reload).
//! - [`worker_template`]: the worker template's fork requests, seen from the template.
//! - [`owner_pipe`]: the worker's end of the owner pipes ([`owner_pipe::OwnerPipe`]) over any
//!   reader/writer pair: the journal's file writes in sequence order, one writer task behind a
//!   bounded queue (persists and deltas never interleave; deltas are dropped when the owner
//!   does not read, persists wait), one reader task (receipts by sequence, `stop`), resend
//!   after a reconnect, and the handoff hold (`handoff`, `handoff_ready`, `adopted`, the grace
//!   period).
//! - [`store`]: the agent's [`drover_agent::TurnStore`], the tools'
//!   [`drover_tools::PromptBroker`], [`drover_tools::ProcessRegistry`] and
//!   [`drover_tools::McpStatusSink`], all persisting
//!   through the owner pipe.
//! - [`bootstrap`]: what a spare makes before its bootstrap ([`Prepared`]), its names,
//!   reading the bootstrap and acknowledging it.
//! - [`turn`]: one turn: the outbox opened, the agent loop run with the tools and the model
//!   (or, when the policy names an external agent, that agent's turn over ACP through
//!   [`drover_external`], persisting `agent.session` once the agent made its session),
//!   `execution.finish` persisted; or the owner lost, or the external agent lost mid-turn
//!   (exited or silent), and the turn's processes killed without `execution.finish`.
//! - [`start`]: the process: its entries ([`main_entry`], [`template_entry`],
//!   [`file_tools_entry`]), the owner-loss checks at start, the runtime, logging and signals.
//!
//! Layers (bottom to top; a module uses only those below it): [`exit`], [`journal`],
//! [`worker_template`] < [`owner_pipe`] < [`store`], [`bootstrap`] < [`turn`] < [`start`].
//!
//! The protocol, as the worker plays it:
//! 1. The owner sends
//!    [`OwnerFrame::Bootstrap`](drover_protocol::worker::OwnerFrame::Bootstrap) and its
//!    [`OwnerFrame::BootstrapPart`](drover_protocol::worker::OwnerFrame::BootstrapPart)s (the
//!    history and input, [`read_bootstrap`]); the worker acknowledges it with a
//!    `started` frame before anything else (until then the owner may give the turn to another
//!    worker: nothing ran), opens the outbox, and the turn runs
//!    (`usage.add`, `transcript.append`, `prompt.open`, `mcp.status` persists, live `delta`
//!    lines). At its end the turn's MCP servers are stopped (`mcp.status` `stopped`).
//! 2. The worker persists `execution.finish`
//!    ([`ExecutionFinish`](drover_protocol::worker::ExecutionFinish)) and, after its receipt,
//!    leaves its outbox folder holding only spare files (the owner recycles it) and exits 0.
//!    A `stop` frame cancels the turn, which then finishes `interrupted` the same way.
//! 3. A `refused` answer stops the turn; the worker exits 2 without `execution.finish`.
//! 4. End of stdin, a broken stdout, SIGTERM (also sent by `PR_SET_PDEATHSIG`) or a changed
//!    parent at start: the owner is gone. The worker cancels the turn, kills its foreground
//!    tool process groups and exits 1 without `execution.finish`; the owner marks the turn
//!    `unknown`.
//! 5. A daemon handoff ([`owner_pipe`] has the detail): `handoff {grace_ms}` clears
//!    `PR_SET_PDEATHSIG` and is answered by `handoff_ready`, after every line before it; then
//!    the worker writes nothing while its turn goes on (persists wait, deltas are dropped once
//!    the queue is full) and it still acts on owner frames. `adopted {epoch}` restamps every
//!    unanswered frame and every later one with `epoch` and lets the output go. No `adopted`
//!    within `grace_ms`, or end of stdin meanwhile: the owner is gone, as in 4.
//!
//! stdout carries frames only; logs go to stderr (`RUST_LOG`, default `info`) and never
//! contain the execution secret or the API key. Exit codes: [`WorkerExit`].

pub mod bootstrap;
pub mod exit;
pub mod journal;
pub mod owner_pipe;
pub mod start;
pub mod store;
pub mod turn;
pub mod worker_template;

pub use bootstrap::{
    read_bootstrap, worker_title, BootstrapError, Prepared, SPARE_NAME, SPARE_TITLE, WORKER_NAME,
};
pub use exit::WorkerExit;
pub use start::{file_tools_entry, main_entry, template_entry, OWNER_PID_ENV, TEMPLATE_TITLE};
pub use turn::{model_config, run_prepared, run_worker};
