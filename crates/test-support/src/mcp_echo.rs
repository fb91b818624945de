//! Where the test fixture binaries of this package (`src/bin/`) are: `drover-mcp-echo` (a stdio
//! MCP server) and `drover-worker-relay` (a `$DROVER_WORKER_EXE` wrapper that plays a worker
//! knowing other executions' secrets) and `drover-test-agent` (a scriptable ACP agent).

use std::path::PathBuf;
use std::sync::OnceLock;

/// The path of the `drover-mcp-echo` binary, in the target directory of the running test.
/// See [`fixture_bin`].
///
/// # Panics
/// When the binary is missing and cannot be built.
pub fn mcp_echo_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| fixture_bin("drover-mcp-echo")).clone()
}

/// The path of the `drover-mock-model` binary (the README's demo model). See [`fixture_bin`].
///
/// # Panics
/// When the binary is missing and cannot be built.
pub fn mock_model_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| fixture_bin("drover-mock-model")).clone()
}

/// The path of the `drover-worker-relay` binary. See [`fixture_bin`].
///
/// # Panics
/// When the binary is missing and cannot be built.
pub fn worker_relay_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| fixture_bin("drover-worker-relay"))
        .clone()
}

/// The path of the `drover-test-agent` binary (a scriptable ACP agent). See [`fixture_bin`].
///
/// # Panics
/// When the binary is missing and cannot be built.
pub fn test_agent_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| fixture_bin("drover-test-agent")).clone()
}

/// The path of this package's binary `name`, in the target directory of the running test.
///
/// Cargo builds a package's binaries only for that package's own integration tests, so a test
/// of another package finds it next to its own target directory: `cargo test --workspace`
/// builds it (this package has integration tests). When it is missing (`cargo test -p` of
/// another package on a clean tree), it is built with `$CARGO build`.
///
/// # Panics
/// When the binary is missing and cannot be built.
fn fixture_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current test executable");
    // target/<profile>/deps/<test> -> target/<profile>
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test executable under target/<profile>/deps")
        .to_path_buf();
    let bin = profile_dir.join(name);
    if !bin.exists() {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut build = std::process::Command::new(cargo);
        build.args(["build", "-p", "drover-test-support", "--bin", name]);
        if profile_dir.file_name().is_some_and(|p| p == "release") {
            build.arg("--release");
        }
        let status = build
            .status()
            .unwrap_or_else(|e| panic!("run cargo build for {name}: {e}"));
        assert!(
            status.success() && bin.exists(),
            "cannot build {}: run `cargo build -p drover-test-support --bins`",
            bin.display()
        );
    }
    bin
}
