//! The `drover-mcp-echo` fixture is where other packages' tests look for it.

#[test]
fn mcp_echo_bin_finds_the_fixture_cargo_built() {
    let built = std::path::PathBuf::from(env!("CARGO_BIN_EXE_drover-mcp-echo"));
    assert!(built.exists(), "{} missing", built.display());
    assert_eq!(drover_test_support::mcp_echo_bin(), built);
}
