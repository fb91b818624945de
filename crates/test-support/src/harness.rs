//! End-to-end harness: the real `drover` binary on a temporary home, real sockets, real
//! processes. Every wait has a timeout and every child is reaped (on drop at the latest).
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use drover_test_support::harness::{Daemon, TestHome};
//! let home = TestHome::new()?;
//! let bin = std::path::Path::new("target/debug/drover");
//! let mut daemon = Daemon::start(bin, home.path()).await?;
//! let mut client = daemon.client().await?;
//! let pong = client.call_ok("ping", serde_json::json!({})).await?;
//! assert_eq!(pong["pong"], true);
//! daemon.stop().await?;
//! # Ok(()) }
//! ```
//!
//! By what it drives: [`home`] (a temporary home and its config), [`daemon`] (the daemon
//! process), [`rpc`] (a raw JSON-RPC client), [`one_session`] (one session's set-ups),
//! [`os_processes`] (`/proc`, signals, children, output lines), [`state_db`] (reads of
//! `state.db`), [`mosquitto`] (the jobs wire's broker). Every item is also at
//! `harness::<item>`.

pub mod daemon;
pub mod home;
pub mod mosquitto;
pub mod one_session;
pub mod os_processes;
pub mod rpc;
pub mod state_db;

pub use crate::wait::{eventually, WAIT};
pub use daemon::*;
pub use home::*;
pub use mosquitto::*;
pub use one_session::*;
pub use os_processes::*;
pub use rpc::*;
pub use state_db::*;
