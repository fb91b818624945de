// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The namespace probe does not depend on the working directory of the process that probes
//! (a daemon started from a project below the temp dir once found "no user namespaces" and ran
//! every tool with the drover home in plain sight). Alone in a process of its own: it changes
//! the process's working directory, which no other test may see.

use std::time::Duration;

use crate::confine::probe;
use drover_test_support::alone;

#[test]
fn the_probe_finds_namespaces_from_a_directory_below_the_temp_dir() {
    if alone::ran_in_child(Duration::from_secs(60)) {
        return;
    }
    let from_root = {
        std::env::set_current_dir("/").unwrap();
        probe()
    };
    assert!(
        from_root.namespaces,
        "this machine has user namespaces: {from_root:?}"
    );
    let below = tempfile::tempdir().unwrap();
    let project = below.path().join("project");
    std::fs::create_dir(&project).unwrap();
    std::env::set_current_dir(&project).unwrap();
    let from_below = probe();
    std::env::set_current_dir("/").unwrap();
    assert!(
        from_below.namespaces && from_below.problems.is_empty(),
        "probing from {} found: {from_below:?}",
        project.display()
    );
}
