//! `drover_client`: the Rust client library of drover's owner daemon (SPEC sections 1, 2 and
//! 8). `drover run`, the session commands and the chat client all use it.
//!
//! What it owns:
//! - **Finding the daemon**: `<home>/daemon.json` ([`drover_protocol::daemon_file`]), the
//!   owner lock, and, with [`StartDaemon::Spawn`], starting `drover --home H daemon
//!   --started-by-client` in the background. When that daemon exits before it answers, the
//!   error says why: its exit status and the last lines of its stderr, which it writes to
//!   `<home>/logs/daemon.stderr.log` ([`START_LOG`]).
//! - **Typed calls**: [`Client::request`] takes a [`drover_protocol::ClientRequest`] and reads
//!   the method's result type; an error answer is [`ClientError::Rpc`] with the owner's
//!   [`drover_protocol::RpcError`] (its `reason` and, for `invalid_params`, its `field`).
//!   Named helpers cover the methods a client uses ([`Client::submit`], [`Client::receipt`],
//!   [`Client::respond_approval`], ...), and session ids are accepted by unique prefix
//!   ([`Client::resolve_session`]).
//! - **Following a session** across dropped connections and owner restarts:
//!   [`Client::attach`] gives a [`SessionStream`] of [`Update`]s. On a dropped connection the
//!   client backs off, reads `daemon.json` again (a restarted daemon has a new port and
//!   token), starts the daemon again when it may, re-attaches every attached session
//!   (`session.resume`) and resumes each stream from its last `seq` with
//!   `session.events.since` (following `has_more`), or hands out a new snapshot when the
//!   daemon says `snapshot_required`. It reads back only what was stored up to the
//!   re-attach (the `last_sequence` `session.resume` answered); what was stored after came
//!   live, and keeps the order the daemon sent it in with the live `message.delta`s between
//!   (read ahead, a turn's `message.complete` would come before its deltas and a client
//!   would show its text twice). A gap in live `seq`s is read back the same way, up to the
//!   event that showed it. It gives up after [`ConnectOptions::reconnect_for`]
//!   with [`ClientError::GaveUp`].
//! - **A handoff** (`drover restart`): the old owner sends `daemon.restarted` and closes
//!   with code 1012. The client reconnects at once to the next owner (found through
//!   `daemon.json` once the next owner rewrote it; never started by the client: it serves
//!   already), re-attaches and catches up as above, and reports
//!   [`ConnectionChange::Restarted`] ("daemon restarted (version X -> Y)") instead of `Lost`
//!   and `Reconnected`: the running turns carry on and session `seq`s go on unchanged.
//! - **The API key check**: the owner writes the SHA-256 of the key it holds into
//!   `daemon.json`; [`Client::api_key_mismatch`] compares it with this process's.
//!
//! Of `config.toml` it reads only `[daemon] tls_cert` (to pin a `wss://` daemon's
//! certificate) and `[model] api_key_env`, with a small serde struct of its own: it does not
//! depend on the owner crate (data flows client -> owner).
//!
//! What it does not do: print, prompt, or decide exit codes (the CLI does), nor hold any
//! state of a session beyond the last `seq` a stream handed out.
//!
//! ```no_run
//! # async fn demo() -> Result<(), drover_client::ClientError> {
//! use drover_client::{Client, ConnectOptions, StartDaemon, Update};
//!
//! let program = std::env::current_exe().map_err(|e| drover_client::ClientError::Config(e.to_string()))?;
//! let client = Client::connect(ConnectOptions::new("/home/me/.drover", StartDaemon::Spawn { program })).await?;
//! let session = client.resolve_session("3f2a").await?;
//! let mut stream = client.attach(&session.session_id).await?;
//! let receipt = client.submit(&session.session_id, "hello").await?;
//! while let Some(update) = stream.next().await {
//!     match update? {
//!         Update::Event(e) => println!("{} {:?}", e.event.kind(), e.seq),
//!         Update::Connection(change) => eprintln!("{change}"),
//!         Update::Snapshot(s) => eprintln!("resumed at seq {}", s.last_sequence),
//!     }
//! }
//! # let _ = receipt;
//! # Ok(()) }
//! ```
//!
//! Layers: `error`, `tls` (leaves); `daemon` on both; `connection` (the task that owns the
//! WebSocket) on `daemon`; `stream` on `connection`; `client` on `stream`.

pub mod client;
pub mod connection;
pub mod daemon;
pub mod error;
pub mod stream;
mod tls;

pub use client::{Client, COMPACT_TIMEOUT};
pub use connection::{parse_result, ConnectionChange};
pub use daemon::{
    owner_pid, read_daemon_info, ApiKeyMismatch, ConnectOptions, StartDaemon, START_LOG,
};
pub use error::ClientError;
pub use stream::{SessionStream, Update};
