//! Delegated jobs and the liveness contract (SPEC section 7).
//!
//! A **job** is a brief handed to an agent that drover does not run itself: a coding agent in a
//! tmux or herdr pane, or a local command; or a prompt to a fresh drover session of an external
//! agent (`acp:<agent>`), whose turn's events are the protocol. drover decides whether the agent is alive by
//! protocol, never by what its screen shows (G5): the job is delivered when the agent publishes
//! `started`, it is alive while heartbeats arrive, it is dead after K missed heartbeats, and a
//! terminal status is final.
//!
//! Pure types, no IO:
//! - [`state`]: the pure state machine — [`JobStatus`] (the wire's type, from
//!   `drover-protocol`), [`EventKind`], the compare-and-set
//!   terminal rule, the [`Contract`] with its defaults and derived idle window, the seq and
//!   attempt rules, and the [`Verdict`] a waiting submitter reaches. Tested exhaustively.
//! - [`error`]: [`JobError`], what every command fails with, each message naming the job,
//!   file, flag or value at fault.
//! - [`sign`]: canonical JSON (as Python's `json.dumps(sort_keys=True, separators=(",", ":"),
//!   ensure_ascii=False)`) and HMAC-SHA256 signatures with constant-time verification.
//! - [`ids`]: job ids, random tokens and the clocks; [`identity`]: [`TimerIdentity`], a pid
//!   plus its start time; [`session`]: the parsed `--agent-session`.
//! - [`job`]: a [`Job`] as stored, and the shapes built from it (`show --json`, the signed
//!   state snapshot).
//! - [`dispatch`]: a remote job's signed [`dispatch::Dispatch`] and the derived `auth_token`.
//! - [`broker_endpoint`]: a broker address; [`settings`]: the wire settings (`[mqtt]`,
//!   `$DROVER_MQTT_URL`).
//!
//! Storage and the wire:
//! - [`registry`]: the SQLite registry (`<registry>/jobs.db`), safe with many processes.
//! - [`wire`]: the [`Wire`] trait an event goes through after it is recorded locally (an
//!   async send; [`wire::send_blocking`] for plain code), and [`wire::LocalOnly`].
//! - [`mqtt`]: the MQTT wire on `rumqttc`'s `AsyncClient` — [`mqtt::MqttWire`] (event, then
//!   the retained state snapshot, acknowledged by the broker), [`mqtt::follow`] (a
//!   self-reconnecting subscription), and [`settings::WireSettings::wire`].
//! - [`brief`]: the brief and the exact commands the agent runs.
//! - [`delivery`]: the transports (`tmux:<target>`, `herdr:<name>`, `exec`).
//! - [`timer`]: the detached heartbeat timer, identified by pid and start time.
//!
//! The commands:
//! - [`publish`](mod@publish): `drover job publish` — record, then stop or start the heartbeat
//!   timer, then send.
//! - [`watch`](mod@watch): `drover job watch` — the watcher rules (signature, attempt, seq gaps,
//!   final terminal snapshots, the idle clock) mirroring the wire into the registry.
//! - [`submit`](mod@submit): `drover job submit` — register, brief, deliver once, and wait
//!   under the contract.
//! - [`remote`]: `submit --agent-session remote:<name>` ([`remote::submit_remote`]).
//! - [`acp`]: `submit --agent-session acp:<agent>` ([`acp::submit_acp`]): a fresh drover session
//!   of an external agent, whose turn's events are the job's (the daemon's side is the
//!   caller's [`acp::AgentSessions`]).
//! - [`runner`]: `drover runner` — admission of signed dispatches and running the command.
//! - [`toolset`]: the `jobs` toolset's operations — submit without waiting (exec agents
//!   detached), judge from stored times, bounded wait, cancel.
//!
//! No blocking call runs on an async executor thread: the registry's transactions (each an
//! fsync) and a timer's drain go through `spawn_blocking` on the async paths, and the MQTT
//! client is driven by the caller's runtime.
//!
//! Layers (each imports only those before it): `state` < `error` < `sign`, `ids`, `identity`,
//! `session`, `broker_endpoint` < `settings`, `job` < `dispatch` < `registry`, `wire` < `mqtt`,
//! `brief` < `delivery`, `timer` < `publish`, `watch` < `submit` < `remote`, `acp` < `runner`,
//! `toolset`.
//!
//! Argument parsing, printing and `drover loop` are in `crates/cli`.
//!
//! ```no_run
//! use drover_jobs::{registry::{NewJob, Registry, EventRequest}, Contract, EventKind};
//!
//! let mut registry = Registry::open(std::path::Path::new("/tmp/jobs"))?;
//! let job = registry.register(NewJob {
//!     job_id: None,
//!     agent_session: None,
//!     prompt: "Fix the flaky test".into(),
//!     contract: Contract::default(),
//!     topic_base: "drover/v1".into(),
//! })?;
//! let recorded = registry.record_event(&EventRequest {
//!     job_id: &job.job_id,
//!     event: Some(EventKind::Started),
//!     ..EventRequest::default()
//! })?;
//! assert_eq!(recorded.message["seq"], 1);
//! # Ok::<(), drover_jobs::JobError>(())
//! ```

pub mod acp;
pub mod brief;
pub mod broker_endpoint;
pub mod delivery;
pub mod dispatch;
pub mod error;
pub mod identity;
pub mod ids;
pub mod job;
pub mod mqtt;
pub mod publish;
pub mod registry;
pub mod remote;
pub mod runner;
pub mod session;
pub mod settings;
pub mod sign;
pub mod state;
pub mod submit;
pub mod timer;
pub mod toolset;
pub mod watch;
pub mod wire;

pub use error::JobError;
pub use identity::TimerIdentity;
pub use job::Job;
pub use publish::{publish, PublishRequest, Published};
pub use registry::Registry;
pub use state::{Contract, ContractInput, EventKind, JobStatus, Refusal, Verdict};
pub use submit::{submit, SubmitOutcome, SubmitRequest};
pub use wire::{Wire, WireOutcome};
