//! A race the file-tool tests provoke: a regular file flipped with a symlink, as fast as it
//! can be, while a tool opens it.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// A thread that flips `path` (a regular file) with a symlink to a target until it is finished
/// or dropped; the name always exists.
pub struct Flipper {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<u64>>,
}

impl Flipper {
    /// Starts flipping `path` with a symlink to `link_target`.
    pub fn start(path: PathBuf, link_target: PathBuf) -> Flipper {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            // The other state waits under a second name; each flip is one exchange of the
            // two names (renameat2 RENAME_EXCHANGE), so the race is tried as often as can be.
            let other = path.with_extension("other");
            std::os::unix::fs::symlink(&link_target, &other).expect("symlink");
            let mut flips = 0u64;
            while !flag.load(Ordering::Relaxed) {
                nix::fcntl::renameat2(
                    None,
                    &path,
                    None,
                    &other,
                    nix::fcntl::RenameFlags::RENAME_EXCHANGE,
                )
                .expect("exchange");
                flips += 1;
            }
            flips
        });
        Flipper {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops flipping; gives how many flips were made.
    pub fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .map(|thread| thread.join().expect("flipper"))
            .unwrap_or(0)
    }
}

impl Drop for Flipper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
