//! The turn's start, seen from the worker: what a worker makes before its bootstrap arrives
//! ([`Prepared`]), its names before and after ([`SPARE_NAME`], [`WORKER_NAME`]; its process
//! titles [`SPARE_TITLE`] and [`worker_title`]), reading the
//! bootstrap's head and parts ([`read_bootstrap`]), and the `started` line that acknowledges
//! it.

use drover_model::{Transport, WarmConnection};
use drover_platform::frame_lines::{read_frame_line, FrameLine};
use drover_protocol::worker::{
    BodyFrame, BodyPiece, Bootstrap, WorkerFrame, MAX_FRAME_BYTES, MODEL_CA_FILE_ENV,
    MODEL_CONNECT_TIMEOUT_ENV, MODEL_ENDPOINT_ENV, MODEL_PROXY_ENV,
};
use tokio::io::{AsyncBufRead, AsyncWrite, AsyncWriteExt};

/// The process name (`comm`) of a worker waiting for its bootstrap: a spare.
pub const SPARE_NAME: &str = "drover-spare";
/// The process name (`comm`) of a worker once its bootstrap arrived: it serves a turn.
pub const WORKER_NAME: &str = "drover-worker";
/// The process title (`ps`, `/proc/<pid>/cmdline`; SPEC section 9) of a worker waiting for
/// its bootstrap.
pub const SPARE_TITLE: &str = "drover worker: spare";

/// The process title of the worker of execution `execution_id` of session `session_id`:
/// `drover worker: <session prefix> <execution_id>`, the prefix being the 8 characters the
/// command line's hints name a session by.
pub fn worker_title(session_id: &str, execution_id: &str) -> String {
    let prefix = session_id.get(..8).unwrap_or(session_id);
    format!("drover worker: {prefix} {execution_id}")
}

/// What a worker makes before its bootstrap arrives, because it does not depend on the turn:
/// the model's HTTP client (its TLS root store) and, once [`Prepared::open_warm`] ran, a
/// connection to the daemon's model endpoint. A spare worker has them ready when the owner
/// hands it a turn.
#[derive(Debug)]
pub struct Prepared {
    pub(crate) http: drover_model::HttpClient,
    /// What `http` was built with: a turn whose policy wants another builds its own client.
    pub(crate) transport: Transport,
    pub(crate) warm: WarmConnection,
}

impl Prepared {
    /// Builds what [`Prepared`] holds: the model's HTTP client, with the daemon's `[model]`
    /// trust, proxy and connect bound ([`spare_transport`]).
    pub fn new() -> Result<Prepared, drover_model::ModelError> {
        let warm = WarmConnection::new();
        let (http, transport) = spare_http(&warm)?;
        Ok(Prepared::with_http(http, transport, warm))
    }

    /// [`Prepared::new`] with an HTTP client built before (by the template, [`spare_http`])
    /// with `warm`'s layer.
    pub fn with_http(
        http: drover_model::HttpClient,
        transport: Transport,
        warm: WarmConnection,
    ) -> Prepared {
        Prepared {
            http,
            transport,
            warm,
        }
    }

    /// Starts opening a connection to the model endpoint the owner named
    /// ([`MODEL_ENDPOINT_ENV`]), while the worker waits for its bootstrap (call inside the
    /// runtime). Without one, nothing is opened.
    pub fn open_warm(&self) {
        if let Some(endpoint) = std::env::var_os(MODEL_ENDPOINT_ENV) {
            self.warm.open(&self.http, &endpoint.to_string_lossy());
        }
    }
}

/// The daemon's `[model] ca_file`, `proxy` and `connect_timeout_s` as the owner named them
/// to this process ([`MODEL_CA_FILE_ENV`], [`MODEL_PROXY_ENV`], [`MODEL_CONNECT_TIMEOUT_ENV`]).
pub fn spare_transport() -> Transport {
    let var = |name: &str| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned());
    Transport {
        ca_file: var(MODEL_CA_FILE_ENV).map(std::path::PathBuf::from),
        proxy: var(MODEL_PROXY_ENV),
        connect_timeout: var(MODEL_CONNECT_TIMEOUT_ENV)
            .and_then(|s| s.parse::<u64>().ok())
            .filter(|&s| s > 0)
            .map(std::time::Duration::from_secs),
    }
}

/// The model's HTTP client with `warm`'s layer and [`spare_transport`], and what it was built
/// with. A `[model] ca_file` or `proxy` that cannot be used leaves a client without them: the
/// turn then builds its own and fails naming the setting, as it would without a spare.
pub fn spare_http(
    warm: &WarmConnection,
) -> Result<(drover_model::HttpClient, Transport), drover_model::ModelError> {
    let transport = spare_transport();
    if !transport.is_default() {
        match warm.http_client_with(&transport) {
            Ok(http) => return Ok((http, transport)),
            Err(e) => tracing::warn!(error = %e, "the spare's client ignores [model] settings"),
        }
    }
    Ok((warm.http_client()?, Transport::default()))
}

/// Why the bootstrap (its head and parts) could not start a turn.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    /// stdin ended before the whole bootstrap arrived: the owner is gone.
    #[error("stdin closed before the whole bootstrap arrived")]
    Eof,
    /// Reading stdin failed.
    #[error("reading the bootstrap failed: {0}")]
    Io(#[from] std::io::Error),
    /// A bootstrap line is longer than [`MAX_FRAME_BYTES`] (its length, newline excluded).
    #[error("a bootstrap frame is {0} bytes, over the {MAX_FRAME_BYTES}-byte frame limit")]
    TooLong(usize),
    /// The first line is not a bootstrap head, or a later one not a part (the parser's
    /// reason).
    #[error("not a valid bootstrap: {0}")]
    Invalid(String),
}

/// Reads the next non-blank line into `buf`.
async fn read_nonblank_line<R>(reader: &mut R, buf: &mut Vec<u8>) -> Result<(), BootstrapError>
where
    R: AsyncBufRead + Unpin,
{
    loop {
        match read_frame_line(reader, buf, MAX_FRAME_BYTES).await? {
            FrameLine::Eof => return Err(BootstrapError::Eof),
            FrameLine::TooLong(bytes) => return Err(BootstrapError::TooLong(bytes)),
            FrameLine::Line if buf.iter().all(u8::is_ascii_whitespace) => continue,
            FrameLine::Line => return Ok(()),
        }
    }
}

/// Reads the bootstrap: the head (the first frame), then the `body_parts` part frames it
/// announces, put together ([`Bootstrap::assemble`]).
pub async fn read_bootstrap<R>(reader: &mut R) -> Result<Bootstrap, BootstrapError>
where
    R: AsyncBufRead + Unpin,
{
    let mut buf = Vec::new();
    read_nonblank_line(reader, &mut buf).await?;
    let head = drover_protocol::worker::read_head(&buf).map_err(BootstrapError::Invalid)?;
    // No longer a spare from here on, whatever the rest brings: `ps` names the turn.
    let _ = drover_platform::set_process_title(&worker_title(
        &head.scope.session_id,
        &head.scope.execution_id,
    ));
    let mut parts = Vec::new();
    while (parts.len() as u64) < head.body_parts {
        read_nonblank_line(reader, &mut buf).await?;
        let piece = serde_json::from_slice::<BodyFrame>(&buf)
            .map_err(|e| e.to_string())
            .and_then(BodyFrame::piece);
        match (piece, head.body_parts) {
            // The whole body in one frame, the common case.
            (Ok(BodyPiece::Whole(body)), 1) => {
                return Ok(Bootstrap::from_head_and_body(head, body));
            }
            (Ok(BodyPiece::Text(text)), _) => parts.push(text),
            (Ok(BodyPiece::Whole(_)), n) => {
                return Err(BootstrapError::Invalid(format!(
                    "a whole bootstrap_body frame, but the head announced {n} parts"
                )))
            }
            (Err(reason), _) => {
                return Err(BootstrapError::Invalid(format!(
                    "expected part {} of {} (type \"bootstrap_body\" or \"bootstrap_part\"), \
                     got {reason}",
                    parts.len() + 1,
                    head.body_parts,
                )))
            }
        }
    }
    Bootstrap::assemble(head, &parts).map_err(|e| BootstrapError::Invalid(e.to_string()))
}

/// Writes the [`WorkerFrame::Started`] line: the bootstrap arrived whole.
pub(crate) async fn acknowledge_bootstrap<W>(writer: &mut W) -> std::io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    let mut line = serde_json::to_vec(&WorkerFrame::Started).map_err(std::io::Error::other)?;
    line.push(b'\n');
    writer.write_all(&line).await?;
    writer.flush().await
}
