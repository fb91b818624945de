//! A private mosquitto broker for the tests of the jobs wire.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::os_processes::signal;

/// A private mosquitto broker on a free loopback port, for tests of the jobs wire. Killed (and
/// reaped) on drop. Panics with a clear message when mosquitto is not installed.
pub struct Mosquitto {
    /// The loopback port it listens on.
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Mosquitto {
    /// Starts a broker. `persist`: keep retained messages across [`Mosquitto::restart`]
    /// (persistence on, in the broker's temporary folder).
    pub fn start(persist: bool) -> Mosquitto {
        Mosquitto::start_with(persist, "")
    }

    /// Starts a broker whose listener speaks TLS (`mqtts://`) with the PEM certificate chain
    /// `cert` and key `key`; no persistence.
    pub fn start_tls(cert: &Path, key: &Path) -> Mosquitto {
        Mosquitto::start_with(
            false,
            &format!("certfile {}\nkeyfile {}\n", cert.display(), key.display()),
        )
    }

    /// `mqtts://127.0.0.1:<port>`, for a broker of [`Mosquitto::start_tls`].
    pub fn tls_url(&self) -> String {
        format!("mqtts://127.0.0.1:{}", self.port)
    }

    /// [`Mosquitto::start`] with `listener_lines` added under the listener.
    fn start_with(persist: bool, listener_lines: &str) -> Mosquitto {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        let mut conf = format!("listener {port} 127.0.0.1\n{listener_lines}allow_anonymous true\n");
        let root = {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
        };
        if root && (persist || !listener_lines.is_empty()) {
            // Root mosquitto drops to the `mosquitto` user, which cannot write or read here.
            conf.push_str("user root\n");
        }
        if persist {
            conf.push_str(&format!(
                "persistence true\npersistence_location {}/\n",
                dir.path().display()
            ));
        } else {
            conf.push_str("persistence false\n");
        }
        std::fs::write(dir.path().join("mosquitto.conf"), conf).expect("write mosquitto.conf");
        let mut broker = Mosquitto {
            port,
            dir,
            child: None,
        };
        broker.spawn();
        broker
    }

    /// `mqtt://127.0.0.1:<port>`
    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }

    fn exe() -> PathBuf {
        for p in ["/usr/sbin/mosquitto", "/usr/bin/mosquitto"] {
            if Path::new(p).is_file() {
                return PathBuf::from(p);
            }
        }
        panic!("these tests need mosquitto (apt-get install mosquitto; .ci/run installs it)");
    }

    fn spawn(&mut self) {
        let log_path = self.dir.path().join("mosquitto.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .expect("open mosquitto.log");
        let child = Command::new(Mosquitto::exe())
            .arg("-c")
            .arg(self.dir.path().join("mosquitto.conf"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log handle"))
            .stderr(log)
            .spawn()
            .expect("mosquitto starts");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "mosquitto did not listen on {} within 10 s: {}",
                self.port,
                std::fs::read_to_string(&log_path).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM (mosquitto saves its persistence file), then SIGKILL after 5 s.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        signal(child.id(), nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts a stopped broker again on the same port.
    pub fn start_again(&mut self) {
        if self.child.is_none() {
            self.spawn();
        }
    }

    /// Stops and starts the broker on the same port.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
