//! What can stop `drover acp` as a whole (a refused request is answered, not raised).

/// Why serving an ACP client ended early.
#[derive(Debug, thiserror::Error)]
pub enum AcpError {
    /// The daemon could not be reached or started.
    #[error(transparent)]
    Daemon(#[from] drover_client::ClientError),
    /// The ACP connection broke (bad framing, a closed transport).
    #[error("ACP connection: {0}")]
    Connection(String),
}
