//! The worker's in-process integration tests, one binary: turns over in-memory pipes with the
//! owner played by hand, the owner pipe and its outbox, a daemon handoff's hold, background
//! processes and the real `terminal` tool. Tests that must be alone in their process (a stopping worker kills every
//! foreground group of the process) rerun themselves in a child
//! ([`drover_test_support::alone`]). `tests/process.rs` runs the worker as a real child
//! process, in a binary of its own.

mod background;
#[path = "../common/mod.rs"]
mod common;
mod external;
mod handoff;
mod owner_pipe;
mod turns;
mod worker_tools;
