//! The OpenAI-compatible chat client (SPEC section 5).
//!
//! `POST {base_url}/chat/completions` with `stream: true` (server-sent events, `data:` lines,
//! `[DONE]`, `stream_options: {include_usage: true}`) or `stream: false` (one JSON body).
//! Tool calls are assembled from streamed deltas by `index`. A stream's headers must come
//! within `first_byte_timeout` (from the first request the endpoint left unanswered; not
//! retried); a response that then sends no byte for `stall_timeout` is cancelled as stalled.
//! Timeouts, stalls, connection errors, 429 and 5xx are retried with bounded exponential
//! backoff (a numeric `Retry-After` on 429/503 is honoured); other 4xx are not, and neither is
//! a stream that already showed text. Every error names the request (`POST {url}`), and an
//! HTML answer says the endpoint is not the API. What this crate does not do: run tools, keep
//! history or persist anything.
//!
//! With `[model] api = "responses"` the same requests go to `POST {base_url}/responses`
//! (OpenAI's Responses API, `store: false`), and a reasoning model's reasoning items are kept
//! for the turn's later requests.
//!
//! Main types: [`ModelClient`] (the reqwest client) behind the [`ChatModel`] trait,
//! [`ModelConfig`], [`Completion`] and [`ModelError`]. Modules:
//!
//! - `error`: [`ModelError`] (each names the request it failed: `POST {url}`) and its spec
//!   reason word.
//! - `answer`: what an answer that is not the API's says (an HTML page, a path with no API),
//!   and bodies cut to a few hundred bytes.
//! - `endpoint`: [`ModelConfig`] and the URLs made from its `base_url`.
//! - `chat_model`: the [`ChatModel`] trait, [`Completion`] and [`WindowLookup`].
//! - `chat_completions` maps drover's chat types to the OpenAI JSON, `stream_assembly` assembles a completion from
//!   chunks, `body` reads a response under the stall bound, `retry` decides what is retried
//!   and when.
//! - `responses` maps them to the Responses API's JSON and keeps reasoning items,
//!   `responses_stream` assembles an answer from its events.
//! - `model_client`: [`ModelClient`] sends a request with them, retries it, records the
//!   `model.request` span ([`span_millis`]) and asks `GET /models` for the context window.
//! - `transport`: the HTTP client's trust (bundled web roots, the platform's store with
//!   `SSL_CERT_FILE` / `SSL_CERT_DIR`, `[model] ca_file`) and proxy (the environment's, or
//!   `[model] proxy`; `NO_PROXY=*` is every host): [`http_client_with`] and [`Transport`];
//!   and what a refused certificate needs changed (`ModelError::Untrusted`'s fix).
//! - `warm`: a spare worker's [`WarmConnection`] to the endpoint, opened before its turn
//!   (TCP, TLS, ALPN; nothing sent) and handed to the turn's first request.
//!
//! Layers: `error` < `answer` < `chat_completions`; `error` < `endpoint`, `chat_model`, `body`, `retry` < `chat_completions` < `stream_assembly` <
//! `responses` < `responses_stream` < `model_client`; `transport` < `model_client` < `warm`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), drover_model::ModelError> {
//! use drover_model::{ChatModel, ModelClient, ModelConfig};
//! use drover_protocol::{ChatMessage, Role, ToolSchemas};
//! let client = ModelClient::new(ModelConfig::new("http://127.0.0.1:4000/v1", "gpt-4o-mini"))?;
//! let msgs = [ChatMessage::text(Role::User, "hi")];
//! let no_tools = ToolSchemas::default();
//! let done = client.chat(&msgs, &no_tools, &mut |delta| print!("{delta}")).await?;
//! println!("{:?} {:?}", done.message.content, done.usage);
//! # Ok(()) }
//! ```

mod answer;
mod body;
mod chat_completions;
mod chat_model;
mod endpoint;
mod error;
mod model_client;
mod responses;
mod responses_stream;
#[cfg(test)]
mod responses_tests;
mod retry;
mod stream_assembly;
#[cfg(test)]
mod tests;
mod transport;
mod warm;

pub use chat_model::{ChatModel, Completion, UsageExtra, WindowLookup};
pub use endpoint::ModelConfig;
pub use error::ModelError;
pub use model_client::{span_millis, ModelClient};
pub use transport::{http_client, http_client_with, HttpClient, Transport};
pub use warm::{WarmConnection, WarmConnector, WarmLayer};
