//! What users and clients see of drover, end to end against the real `drover` binary: `drover
//! run`, `chat`, `sessions` and the terminal UI, the dashboard in a browser, the typed client
//! library, ACP clients and the ACP WebSocket, the JSON-RPC envelope and the wire of every
//! method, prompts and per-session settings, clients across `drover restart`, and `drover
//! service`'s systemd user unit. One binary, one module per concern.

#[path = "../common/mod.rs"]
mod common;

mod acp_clients;
mod acp_durability;
mod acp_ws;
mod approval_scope_escapes;
mod approval_scopes;
mod chat;
mod client_library;
mod dashboard;
mod external_agents;
mod interrupt_cmd;
mod prompts;
mod protocol_wire;
mod restart_clients;
mod rpc;
mod run_cli;
mod run_front_door;
mod service;
mod session_cmd;
mod session_settings;
mod terminal_ui;
mod typed_client;
