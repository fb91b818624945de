//! A private tinyproxy, a real HTTP CONNECT proxy as companies run one, for the tests of a
//! model endpoint reached through a proxy.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A tinyproxy on a free loopback port, in the foreground, its log in a temporary folder;
/// killed (and reaped) on drop. Panics with a clear message when tinyproxy is not installed.
pub struct Tinyproxy {
    /// The loopback port it listens on.
    pub port: u16,
    dir: tempfile::TempDir,
    child: Child,
}

impl Tinyproxy {
    /// Starts a proxy that allows `CONNECT` to `connect_port` only.
    pub fn start(connect_port: u16) -> Tinyproxy {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        let conf = format!(
            "Port {port}\nListen 127.0.0.1\nTimeout 60\nLogLevel Connect\nMaxClients 20\n\
             Allow 127.0.0.1\nConnectPort {connect_port}\n"
        );
        let conf_path = dir.path().join("tinyproxy.conf");
        std::fs::write(&conf_path, conf).expect("write tinyproxy.conf");
        let log_path = dir.path().join("tinyproxy.log");
        let log = std::fs::File::create(&log_path).expect("create tinyproxy.log");
        // `-d`: in the foreground, logging to stderr, so this handle owns the process.
        let child = Command::new(Tinyproxy::exe())
            .arg("-d")
            .arg("-c")
            .arg(&conf_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log handle"))
            .stderr(log)
            .spawn()
            .expect("tinyproxy starts");
        let proxy = Tinyproxy { port, dir, child };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "tinyproxy did not listen on {port} within 10 s: {}",
                proxy.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        proxy
    }

    /// `http://127.0.0.1:<port>`
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The proxy's log so far (each request as `Request (file descriptor N): CONNECT
    /// host:port HTTP/1.1`).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("tinyproxy.log")).unwrap_or_default()
    }

    /// How many `CONNECT` requests to `target` (`host:port`) the proxy logged.
    pub fn connects_to(&self, target: &str) -> usize {
        let request = format!(": CONNECT {target} ");
        self.log()
            .lines()
            .filter(|line| line.contains(&request))
            .count()
    }

    fn exe() -> PathBuf {
        for p in ["/usr/bin/tinyproxy", "/usr/sbin/tinyproxy"] {
            if Path::new(p).is_file() {
                return PathBuf::from(p);
            }
        }
        panic!("these tests need tinyproxy (apt-get install tinyproxy; .ci/run installs it)");
    }
}

impl Drop for Tinyproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
