//! Serving one ACP client over a transport (stdio, or lines of the daemon's WebSocket) as a
//! client of the home's daemon.

use agent_client_protocol::{Lines, Stdio};
use drover_client::{Client, ConnectOptions};
use tokio::sync::mpsc;

use crate::error::AcpError;
use crate::handlers::{handlers, NewSessions, Shared};

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

/// Serves one ACP client until it goes away, as a client of the daemon `options` name (started
/// first when `options` allow it and none runs); the sessions it makes are `new_sessions`.
pub async fn serve(
    transport: Transport,
    options: ConnectOptions,
    new_sessions: NewSessions,
) -> Result<(), AcpError> {
    let client = Client::connect(options.clone()).await?;
    let agent = handlers(Shared::new(client, options, new_sessions));
    let served = match transport {
        Transport::Stdio => agent.connect_to(Stdio::new()).await,
        Transport::Lines { incoming, outgoing } => {
            let incoming = futures::stream::unfold(incoming, |mut rx| async move {
                rx.recv()
                    .await
                    .map(|line| (Ok::<_, std::io::Error>(line), rx))
            });
            let outgoing = futures::sink::unfold(outgoing, |tx, line: String| async move {
                tx.send(line)
                    .await
                    .map_err(|_| std::io::Error::from(std::io::ErrorKind::BrokenPipe))?;
                Ok::<_, std::io::Error>(tx)
            });
            agent
                .connect_to(Lines::new(Box::pin(outgoing), Box::pin(incoming)))
                .await
        }
    };
    served.map_err(|e| AcpError::Connection(e.to_string()))
}
