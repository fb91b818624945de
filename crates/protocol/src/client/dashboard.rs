//! What the web dashboard (`/ui`) asks besides the session methods. Any client may call
//! these (no private endpoints): `daemon.info` says which daemon start answers, so a client
//! that reconnects sees the epoch change after a restart; `ui.login_code` gives `drover ui` a
//! one-time code for `/ui/login`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::secret::Secret;

/// Result of `daemon.info`: the daemon start that answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DaemonStart {
    /// The runtime epoch this start raised (SPEC section 1); a restart raises it.
    pub epoch: u64,
    /// The random id of this owner instance.
    pub instance_id: String,
    /// The daemon's process id.
    pub pid: u32,
    /// Unix seconds when it started.
    pub started_at: f64,
}

/// Result of `ui.login_code`: a code for `/ui/login`, good once, for
/// [`UiLoginCode::expires_in_s`] seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct UiLoginCode {
    /// The code (it logs a browser in: never logged).
    pub code: Secret,
    /// `http://127.0.0.1:<port>/ui/login?code=<code>`: the link to open.
    pub url: Secret,
    /// Seconds the code stays good (60).
    pub expires_in_s: u64,
}
