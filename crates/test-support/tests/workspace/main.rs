//! Checks of the workspace as a whole, one binary: no crate's top-level modules import each
//! other in a circle, and the fixture binaries are where other packages' tests look for them.
//! Being an integration test target of this package also makes `cargo test --workspace`
//! build those fixture binaries.

mod mcp_echo;
mod module_graph;
