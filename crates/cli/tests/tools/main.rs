//! What a session's tools do end to end against the real `drover` binary: the file toolset,
//! background processes, MCP servers, the sandbox, `delegate_task`, and jobs (`drover job`,
//! its MQTT wire, remote runners and the `jobs` toolset). One binary, one module per concern.

#[path = "../common/mod.rs"]
mod common;

mod background;
mod delegation;
mod file_tools;
mod jobs;
mod jobs_acp;
mod jobs_remote;
mod jobs_tools;
mod jobs_wire;
mod mcp;
mod sandbox;
