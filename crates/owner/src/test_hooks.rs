//! Hooks a test sets through the environment to hold the daemon at one point, as a slow disk
//! or a slow start would. Unset (always, outside tests), each is one `getenv` and returns.

use std::path::Path;
use std::time::Duration;

/// The longest a hold lasts: a test that forgets to release it does not hang the daemon.
const HOLD_MOST: Duration = Duration::from_secs(60);

/// When `env` names a path, creates `<path>.reached` (holding this pid) and waits, at most
/// [`HOLD_MOST`], for `<path>.release`; returns at once without it.
pub(crate) fn hold_for_tests(env: &str) {
    let Some(path) = std::env::var_os(env) else {
        return;
    };
    let mut reached = path.clone();
    reached.push(".reached");
    let mut release = path;
    release.push(".release");
    let _ = std::fs::write(&reached, std::process::id().to_string());
    let deadline = std::time::Instant::now() + HOLD_MOST;
    while !Path::new(&release).exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
}
