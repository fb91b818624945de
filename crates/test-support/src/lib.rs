//! Test support for drover's end-to-end tests and benchmarks.
//!
//! - [`mock_model`]: a loopback, scriptable OpenAI-compatible model server (stream and
//!   non-stream, tool calls, usage, gates that hold a response, a request log).
//! - [`harness`]: starts the real `drover` binary on a temporary home and speaks the real
//!   WebSocket JSON-RPC to it, with a timeout on every wait.
//!
//! Nothing here mocks a drover component: only the model is played.

pub mod harness;
pub mod mock_model;

pub use mock_model::{Gate, MockModel, Reply};
