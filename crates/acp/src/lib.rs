//! `drover_acp`: drover as an Agent Client Protocol agent (ACP v1, JSON-RPC 2.0), for editors
//! and ACP clients. `drover acp` serves it on stdio; the daemon serves it on a WebSocket at
//! `/v1/acp` (docs/acp.md).
//!
//! Skeleton: filled in by the next commits.

pub mod error;

pub use error::AcpError;

use drover_client::ConnectOptions;
use tokio::sync::mpsc;

/// Where the ACP client is.
pub enum Transport {
    /// This process's stdin and stdout (`drover acp`).
    Stdio,
    /// One JSON-RPC message per line each way (the daemon's `/v1/acp` WebSocket: one text
    /// frame per message).
    Lines {
        /// Messages from the ACP client.
        incoming: mpsc::Receiver<String>,
        /// Messages to the ACP client.
        outgoing: mpsc::Sender<String>,
    },
}

/// Serves one ACP client until it goes away, as a client of the daemon `options` name.
pub async fn serve(transport: Transport, options: ConnectOptions) -> Result<(), AcpError> {
    let _ = (transport, options);
    Ok(())
}
