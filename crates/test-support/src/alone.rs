//! Tests that must be alone in their process, inside an area's test binary where other tests
//! run beside them: one that changes the working directory, acts on a process-wide set (the
//! foreground groups a stopping worker kills) or installs a panic hook. Such a test runs again
//! as the only test of a child process: the same test binary, filtered to its exact name.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Set in the child: the name of the one test it runs.
const CHILD: &str = "DROVER_TEST_ALONE";

/// How often the parent looks whether the child has ended.
const POLL: Duration = Duration::from_millis(20);

/// Whether the calling test was just run alone in a child process (the caller returns at
/// once): in the parent, runs the same test as the only test of a child and panics with the
/// child's output unless it passed within `bound` (a child still running then is killed). In
/// the child, gives `false` and the test goes on.
///
/// Call it first in the test's body, on the thread libtest named after the test.
pub fn ran_in_child(bound: Duration) -> bool {
    if std::env::var_os(CHILD).is_some() {
        return false;
    }
    let thread = std::thread::current();
    let name = thread
        .name()
        .filter(|name| *name != "main")
        .expect("libtest runs each test on a thread named after the test");
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut child = Command::new(exe)
        .args(["--exact", name, "--test-threads=1"])
        .env(CHILD, name)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the test binary again");
    let stdout = drain(child.stdout.take().expect("piped stdout"));
    let stderr = drain(child.stderr.take().expect("piped stderr"));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            break Some(status);
        }
        if start.elapsed() > bound {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(POLL);
    };
    let stdout = stdout.join().expect("stdout reader");
    let stderr = stderr.join().expect("stderr reader");
    // What the test printed, shown as a test's own output is (libtest captures it unless
    // --nocapture).
    print!("{stdout}");
    eprint!("{stderr}");
    let Some(status) = status else {
        panic!("{name} alone in its process did not end within {bound:?}");
    };
    // A filter that matched nothing passes too: the count proves the test ran.
    assert!(
        status.success() && stdout.contains("test result: ok. 1 passed"),
        "{name} alone in its process failed ({status})"
    );
    true
}

/// Reads `pipe` to its end on a thread of its own, so a child writing much is never blocked.
fn drain(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}
