//! The daemon and its workers, end to end against the real `drover` binary: starting and
//! stopping, the home's integrity, durable admissions and crash recovery, turns, liveness,
//! spare and dying workers, hardening and chaos, telemetry, usage reports, model endpoints
//! behind TLS and proxies. One binary, one module per concern; the chaos test installs a
//! panic hook, so it runs alone in a child process ([`drover_test_support::alone`]).

#[path = "../common/mod.rs"]
mod common;

mod budgets;
mod chaos;
mod daemon_lifecycle;
mod handoff;
mod hardening;
mod integrity;
mod liveness;
mod long_sessions;
mod model_endpoints;
mod model_errors;
mod process_titles;
mod recovery;
mod secrets;
mod spare_worker;
mod start_rules;
mod telemetry;
mod turns;
mod usage_bounds;
mod usage_report;
mod warm_connection;
mod worker_binding;
mod worker_deaths;
