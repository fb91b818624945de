//! The wire an event goes through after it is recorded locally (SPEC section 7: "records the
//! event locally first, then sends it on the wire").
//!
//! The registry is always first; a [`Wire`] only ever sees events that are already stored,
//! with their seq and signature. With no `[mqtt] url` (and no `$DROVER_MQTT_URL`) the wire is
//! [`LocalOnly`] and `publish` exits 0 after recording. With a URL it is the MQTT wire (the
//! `mqtt` module's `MqttWire`): the event to `<topic_prefix>/events`, then the retained
//! snapshot to `<topic_prefix>/state`, on one connection.
//!
//! A send is asynchronous: async code awaits it on its own runtime. Plain code (`drover job
//! publish`, a `spawn_blocking` thread) uses [`send_blocking`], which drives the same future
//! on a runtime of its own on the calling thread.

use std::future::Future;
use std::pin::Pin;

use serde_json::Value;

use crate::job::Job;

pub use crate::broker_endpoint::redact_url;
pub use crate::settings::{WireConfig, WireSettings, DEFAULT_TOPIC_BASE, MQTT_URL_ENV};

/// What happened to a recorded event on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireOutcome {
    /// No wire is configured: recorded locally, nothing to send (exit 0).
    LocalOnly,
    /// Sent to the broker, which acknowledged it (exit 0).
    Sent,
    /// Recorded, but the broker could not be reached (exit 2); the reason.
    Unreachable(String),
}

impl WireOutcome {
    /// The word `publish --json` prints in `wire`.
    pub fn as_str(&self) -> &'static str {
        match self {
            WireOutcome::LocalOnly => "local_only",
            WireOutcome::Sent => "sent",
            WireOutcome::Unreachable(_) => "unreachable",
        }
    }
}

/// A send in progress (see [`Wire::send`]).
pub type Sending<'a> = Pin<Box<dyn Future<Output = WireOutcome> + Send + 'a>>;

/// A transport for recorded events. Implementations never write the registry.
pub trait Wire: Send + Sync {
    /// Sends `message` (a signed event of `job`) and then, unless `state` is `None`
    /// (`--no-state`), the signed state snapshot, on one connection. The future is bounded
    /// (an unreachable broker costs a few seconds) and never blocks its thread.
    fn send<'a>(
        &'a self,
        job: &'a Job,
        message: &'a Value,
        state: Option<&'a Value>,
    ) -> Sending<'a>;
}

/// [`Wire::send`] for plain code: drives the send on a current-thread runtime of its own, on
/// this thread. For code with no runtime (`drover job publish`) and for `spawn_blocking`
/// threads; never call it on an async executor thread (tokio refuses to nest a runtime
/// there): async code awaits [`Wire::send`] instead.
pub fn send_blocking(
    wire: &dyn Wire,
    job: &Job,
    message: &Value,
    state: Option<&Value>,
) -> WireOutcome {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt.block_on(wire.send(job, message, state)),
        Err(e) => WireOutcome::Unreachable(format!("cannot start the wire's runtime: {e}")),
    }
}

/// No wire: every event stays local.
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalOnly;

impl Wire for LocalOnly {
    fn send<'a>(&'a self, _: &'a Job, _: &'a Value, _: Option<&'a Value>) -> Sending<'a> {
        Box::pin(std::future::ready(WireOutcome::LocalOnly))
    }
}
