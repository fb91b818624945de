//! The tools' integration tests, one binary: each module is one toolset or concern against
//! real processes and files. A test that must be alone in its process (it acts on the
//! process-wide foreground groups) reruns itself in a child ([`drover_test_support::alone`]).

mod approval_cases;
mod background;
mod common;
mod file_tools;
mod foreground_kill_all;
mod mcp;
mod sandbox;
mod terminal;
mod todo;
