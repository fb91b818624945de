// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The confinement steps on real processes: each test runs a command under a plan
//! and checks the kernel refuses what it must, and that the same command without that layer
//! succeeds (so the test fails when the layer is switched off).
//!
//! This machine offers user namespaces and Landlock (ABI 7); the tests assume both.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};

use crate::confine::{probe, LandlockSpec, Plan, Spec};
use drover_test_support::{alone, outside_path};

fn abi() -> u32 {
    probe().landlock_abi.expect("this machine has Landlock")
}

/// `sh -c script` in `cwd` under `spec`.
fn run(spec: &Spec, cwd: &Path, script: &str) -> Output {
    let plan = Plan::new(spec).expect("plan");
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(script)
        .current_dir(cwd)
        .stdin(Stdio::null());
    plan.install(&mut command);
    command.output().expect("spawned")
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn workspace(roots: &[&Path], network: bool) -> Spec {
    Spec {
        namespaces: true,
        hidden: Vec::new(),
        landlock: Some(LandlockSpec {
            abi: abi(),
            writable_roots: roots.iter().map(|r| r.to_path_buf()).collect(),
            writable_files: Vec::new(),
            network,
        }),
        ..Spec::default()
    }
}

fn no_landlock(spec: &Spec) -> Spec {
    Spec {
        landlock: None,
        ..spec.clone()
    }
}

#[test]
fn the_probe_finds_namespaces_and_landlock_here() {
    let support = probe();
    assert!(support.namespaces, "{support:?}");
    assert!(
        support.landlock_abi.is_some_and(|abi| abi >= 4),
        "{support:?}"
    );
    assert!(support.problems.is_empty(), "{support:?}");
}

#[test]
fn workspace_write_allows_the_roots_and_refuses_elsewhere_for_grandchildren_too() {
    let cwd = tempfile::tempdir().expect("cwd");
    let probe = outside_path("probe");
    let spec = workspace(&[cwd.path()], true);

    let out = run(&spec, cwd.path(), "touch ok && echo wrote");
    assert!(out.status.success(), "{}", text(&out));
    assert!(cwd.path().join("ok").exists());

    let touch = format!("touch {}", probe.display());
    let out = run(&spec, cwd.path(), &touch);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("Permission denied"), "{}", text(&out));
    let grandchild = format!("sh -c 'sh -c \"{touch}\"'");
    let out = run(&spec, cwd.path(), &grandchild);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(!probe.exists());

    // The same command without the Landlock layer writes: the refusal above is Landlock's.
    let out = run(&no_landlock(&spec), cwd.path(), &grandchild);
    assert!(out.status.success(), "{}", text(&out));
    assert!(probe.exists());
    std::fs::remove_file(&probe).expect("cleanup");
}

#[test]
fn a_python_rmtree_outside_the_roots_leaves_the_directory_intact() {
    let cwd = tempfile::tempdir().expect("cwd");
    let victim = outside_path("victim");
    std::fs::create_dir_all(victim.join("sub")).expect("victim");
    std::fs::write(victim.join("sub").join("file"), "keep me").expect("file");
    let spec = workspace(&[cwd.path()], true);
    let script = format!(
        "/usr/bin/python3 -c 'import shutil; shutil.rmtree(\"{}\")'",
        victim.display()
    );
    let out = run(&spec, cwd.path(), &script);
    assert!(!out.status.success(), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(victim.join("sub").join("file")).expect("still there"),
        "keep me"
    );
    let out = run(&no_landlock(&spec), cwd.path(), &script);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!victim.exists(), "without Landlock the rmtree goes through");
}

#[test]
fn read_only_refuses_writes_even_in_the_cwd_but_not_to_dev_null() {
    let cwd = tempfile::tempdir().expect("cwd");
    let spec = workspace(&[], true);
    let out = run(&spec, cwd.path(), "echo x > /dev/null && ls / > /dev/null");
    assert!(out.status.success(), "{}", text(&out));
    let out = run(&spec, cwd.path(), "touch ok");
    assert!(!out.status.success(), "{}", text(&out));
    assert!(!cwd.path().join("ok").exists());
}

#[test]
fn network_false_refuses_a_loopback_connect_and_true_allows_it() {
    let cwd = tempfile::tempdir().expect("cwd");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listener");
    let port = listener.local_addr().expect("addr").port();
    let script = format!(
        "/usr/bin/python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 5); print(\"connected\")'"
    );
    let blocked = run(&workspace(&[cwd.path()], false), cwd.path(), &script);
    assert!(!blocked.status.success(), "{}", text(&blocked));
    assert!(
        text(&blocked).contains("Permission denied"),
        "{}",
        text(&blocked)
    );
    let open = run(&workspace(&[cwd.path()], true), cwd.path(), &script);
    assert!(open.status.success(), "{}", text(&open));
    assert!(text(&open).contains("connected"));
}

#[test]
fn the_hidden_home_reads_as_empty_and_cannot_be_unmounted_even_without_landlock() {
    let cwd = tempfile::tempdir().expect("cwd");
    let home = tempfile::tempdir().expect("home");
    std::fs::write(home.path().join("daemon.json"), "{\"token\":\"secret\"}").expect("file");
    let script = format!(
        "ls -A {home}; cat {home}/daemon.json && echo READ; umount {home} || umount -l {home} \
         || echo UMOUNT_REFUSED; cat {home}/daemon.json && echo READ_AFTER",
        home = home.path().display()
    );
    for landlock in [true, false] {
        let mut spec = workspace(&[cwd.path()], true);
        spec.hidden = vec![home.path().to_path_buf()];
        if !landlock {
            spec = no_landlock(&spec);
        }
        let out = run(&spec, cwd.path(), &script);
        let shown = text(&out);
        assert!(!shown.contains("daemon.json\n"), "{landlock}: {shown}");
        assert!(!shown.contains("READ"), "{landlock}: {shown}");
        assert!(!shown.contains("secret"), "{landlock}: {shown}");
        assert!(shown.contains("UMOUNT_REFUSED"), "{landlock}: {shown}");
    }
    // Without the namespace layer the home is right there.
    let out = run(
        &Spec {
            namespaces: false,
            ..workspace(&[cwd.path()], true)
        },
        cwd.path(),
        &format!("cat {}/daemon.json", home.path().display()),
    );
    assert!(text(&out).contains("secret"));
}

#[test]
fn a_hidden_home_removed_after_the_plan_was_made_does_not_stop_the_process() {
    // Another drover home is deleted between the plan (which saw it) and the spawn (which
    // mounts over it): there is nothing left to hide, and the tool process must still start.
    let cwd = tempfile::tempdir().expect("cwd");
    let parent = tempfile::tempdir().expect("parent");
    let home = parent.path().join("gone").join("home");
    std::fs::create_dir_all(&home).expect("home");
    let mut spec = workspace(&[cwd.path()], true);
    spec.hidden = vec![home.clone()];
    let plan = Plan::new(&spec).expect("plan");
    std::fs::remove_dir_all(parent.path().join("gone")).expect("removed");
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg("echo STARTED")
        .current_dir(cwd.path())
        .stdin(Stdio::null());
    plan.install(&mut command);
    let out = command
        .output()
        .expect("the process starts although the home is gone");
    assert!(text(&out).contains("STARTED"), "{}", text(&out));
}

#[test]
fn a_child_started_inside_the_hidden_home_does_not_see_it_by_relative_paths() {
    let home = tempfile::tempdir().expect("home");
    std::fs::write(home.path().join("daemon.json"), "{\"token\":\"secret\"}").expect("file");
    let mut spec = workspace(&[], true);
    spec.hidden = vec![home.path().to_path_buf()];
    // std enters the working directory before the confinement step, below the mount to be.
    let out = run(&spec, home.path(), "cat daemon.json; ls -A");
    let shown = text(&out);
    assert!(!shown.contains("secret"), "{shown}");
    assert!(!shown.contains("daemon.json\n"), "{shown}");
}

/// The worker is non-dumpable, and so is every child it forks until exec: the namespace step
/// must still write its id maps when drover does not run as root (run this binary as another
/// user to see it; as root it passes either way).
#[test]
fn a_non_dumpable_parent_still_hides_the_home() {
    // Alone in a process of its own: dumpability is process-wide.
    if alone::ran_in_child(std::time::Duration::from_secs(60)) {
        return;
    }
    crate::set_non_dumpable().expect("non-dumpable");
    let cwd = tempfile::tempdir().expect("cwd");
    let home = tempfile::tempdir().expect("home");
    std::fs::write(home.path().join("daemon.json"), "{\"token\":\"secret\"}").expect("file");
    let mut spec = workspace(&[cwd.path()], true);
    spec.hidden = vec![home.path().to_path_buf()];
    let out = run(
        &spec,
        cwd.path(),
        &format!("cat {}/daemon.json", home.path().display()),
    );
    assert!(!text(&out).contains("secret"), "{}", text(&out));
    assert!(!out.status.success(), "{}", text(&out));
}

#[test]
fn a_confined_child_inherits_no_stray_descriptor() {
    use std::os::fd::AsRawFd;
    // Not close-on-exec, as a descriptor the daemon inherited from its launcher would be.
    let stray = std::fs::File::open("/etc/hostname").expect("open");
    let fd = stray.as_raw_fd();
    nix::fcntl::fcntl(
        fd,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    )
    .expect("clear close-on-exec");
    let cwd = tempfile::tempdir().expect("cwd");
    let probe = format!("test -e /proc/self/fd/{fd} && echo INHERITED || echo CLOSED");
    let out = run(&workspace(&[cwd.path()], true), cwd.path(), &probe);
    assert!(text(&out).contains("CLOSED"), "{}", text(&out));
    // Started without a plan, the same command sees it: the probe itself works.
    let out = Command::new("sh")
        .arg("-c")
        .arg(&probe)
        .output()
        .expect("spawned");
    assert!(text(&out).contains("INHERITED"), "{}", text(&out));
}

/// The home cannot be moved aside by renaming a directory above it (then a decoy at its old
/// path would get the daemon's next `daemon.json`).
#[test]
fn no_directory_above_the_hidden_home_can_be_renamed() {
    let cwd = tempfile::tempdir().expect("cwd");
    let home = cwd.path().join("nest/deeper/home");
    std::fs::create_dir_all(&home).expect("home");
    let mut spec = workspace(&[cwd.path()], true);
    spec.hidden = vec![home.clone()];
    let script = "mv nest nest2 || echo REFUSED1; mv nest/deeper nest/d2 || echo REFUSED2; \
                  mkdir -p nest/deeper/home2 && echo WRITES_OK";
    for landlock in [true, false] {
        let spec = if landlock {
            spec.clone()
        } else {
            no_landlock(&spec)
        };
        let out = run(&spec, cwd.path(), script);
        let shown = text(&out);
        assert!(
            shown.contains("REFUSED1") && shown.contains("REFUSED2"),
            "{landlock}: {shown}"
        );
        assert!(shown.contains("WRITES_OK"), "{landlock}: {shown}");
        assert!(home.is_dir(), "{landlock}: the home moved");
    }
}

#[test]
fn a_confined_child_has_no_capability_left() {
    let cwd = tempfile::tempdir().expect("cwd");
    let spec = no_landlock(&workspace(&[cwd.path()], true));
    let out = run(
        &spec,
        cwd.path(),
        "grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb)' /proc/self/status",
    );
    let shown = text(&out);
    assert_eq!(
        shown
            .lines()
            .filter(|l| l.ends_with("0000000000000000"))
            .count(),
        5,
        "{shown}"
    );
}

#[test]
fn a_non_dumpable_process_environ_cannot_be_read_by_a_confined_child() {
    let cwd = tempfile::tempdir().expect("cwd");
    // PR_SET_DUMPABLE is 4.
    let mut helper = Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(
            "import ctypes, sys, time\n\
             assert ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) == 0\n\
             print('ready', flush=True)\n\
             time.sleep(60)",
        )
        .env("DROVER_PLANTED_SECRET", "planted-value-4711")
        .stdout(Stdio::piped())
        .spawn()
        .expect("helper");
    let mut line = String::new();
    BufReader::new(helper.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("ready line");
    assert_eq!(line.trim(), "ready");
    let script = format!("cat /proc/{}/environ | tr '\\0' '\\n'", helper.id());

    let confined = run(&workspace(&[cwd.path()], true), cwd.path(), &script);
    let namespaces_only = run(
        &no_landlock(&workspace(&[cwd.path()], true)),
        cwd.path(),
        &script,
    );
    let plain = run(&Spec::default(), cwd.path(), &script);
    helper.kill().expect("kill helper");
    helper.wait().expect("reap helper");

    assert!(
        !text(&confined).contains("planted-value-4711"),
        "{}",
        text(&confined)
    );
    assert!(
        !text(&namespaces_only).contains("planted-value-4711"),
        "{}",
        text(&namespaces_only)
    );
    // Root outside a namespace keeps CAP_SYS_PTRACE and reads it: the namespace is what stops
    // the confined child. (Not root: a non-dumpable process is unreadable anyway.)
    if std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").expect("proc")) == 0 {
        assert!(
            text(&plain).contains("planted-value-4711"),
            "{}",
            text(&plain)
        );
    }
}

/// A process to signal: `sleep 60`, killed and reaped on drop.
struct Sleeper(std::process::Child);

impl Sleeper {
    fn start() -> Sleeper {
        Sleeper(Command::new("sleep").arg("60").spawn().expect("sleep"))
    }

    /// The process's state letter in `/proc/<pid>/stat` (`T` when stopped).
    fn state(&self) -> char {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.0.id())).expect("stat");
        let after = stat.rsplit_once(") ").expect("stat shape").1;
        after.chars().next().expect("state")
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_scoped_child_cannot_signal_a_process_outside_its_domain_but_can_its_own() {
    let cwd = tempfile::tempdir().expect("cwd");
    let outside = Sleeper::start();
    let script = format!(
        "kill -STOP {pid} && echo STOPPED; sleep 30 & kill $! && wait $!; echo OWN_RC=$?",
        pid = outside.0.id()
    );
    let scoped = Spec {
        scoped: true,
        ..workspace(&[cwd.path()], true)
    };
    // With and without the write rules (an approved `sandbox: false` call).
    for spec in [scoped.clone(), no_landlock(&scoped)] {
        let out = run(&spec, cwd.path(), &script);
        let shown = text(&out);
        assert!(!shown.contains("STOPPED"), "{shown}");
        // SIGTERM: 128 + 15.
        assert!(shown.contains("OWN_RC=143"), "{shown}");
        assert_ne!(outside.state(), 'T', "{shown}");
        assert!(run(&spec, cwd.path(), "true").status.success());
        assert!(Plan::new(&spec).expect("plan").enforced().scoped);
    }
    // Unscoped, the same command stops it: the refusal above is the scope's.
    let out = run(&workspace(&[cwd.path()], true), cwd.path(), &script);
    assert!(text(&out).contains("STOPPED"), "{}", text(&out));
    // A stop is delivered when the target is next scheduled: on a loaded machine, a moment
    // after `kill` returned.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while outside.state() != 'T' && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(outside.state(), 'T');
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(outside.0.id() as i32),
        nix::sys::signal::Signal::SIGCONT,
    )
    .expect("continue");
}

/// Python that tries each way out and prints one `name: OPEN` or `name: closed <error>` line.
const NET_PROBE: &str = r#"
import socket, sys
port, udp_port, abstract = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
def attempt(name, how):
    try:
        how()
        print(f"{name}: OPEN", flush=True)
    except Exception as e:
        print(f"{name}: closed {e!r}", flush=True)
def tcp(proto=0):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, proto)
    s.settimeout(3)
    s.connect(("127.0.0.1", port))
def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(3)
    s.connect(("127.0.0.1", udp_port))
    s.send(b"ping")
    s.recv(10)
def unix_abstract():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(3)
    s.connect("\0" + abstract)
def own_loopback():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    socket.create_connection(server.getsockname(), 3)
attempt("tcp", tcp)
attempt("mptcp", lambda: tcp(262))
attempt("udp", udp)
attempt("abstract", unix_abstract)
attempt("dns", lambda: socket.getaddrinfo("example.com", 80))
attempt("own loopback", own_loopback)
"#;

#[test]
fn an_isolated_network_reaches_nothing_outside_but_its_own_loopback() {
    use std::os::linux::net::SocketAddrExt;
    let cwd = tempfile::tempdir().expect("cwd");
    std::fs::write(cwd.path().join("probe.py"), NET_PROBE).expect("probe");
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").expect("tcp");
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
    udp.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .expect("timeout");
    let name = format!("drover-confine-test-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).expect("name");
    let abstract_listener = std::os::unix::net::UnixListener::bind_addr(&addr).expect("abstract");
    // The UDP listener answers one datagram, so an open path shows as OPEN.
    let echo = udp.try_clone().expect("clone");
    let answer = std::thread::spawn(move || {
        let mut buf = [0u8; 16];
        if let Ok((_, from)) = echo.recv_from(&mut buf) {
            let _ = echo.send_to(b"pong", from);
        }
    });
    let script = format!(
        "/usr/bin/python3 probe.py {} {} {name}",
        tcp.local_addr().expect("addr").port(),
        udp.local_addr().expect("addr").port(),
    );
    let isolated = Spec {
        isolate_network: true,
        // The write rules allow TCP: the namespace alone closes everything.
        ..workspace(&[cwd.path()], true)
    };
    let plan = Plan::new(&isolated).expect("plan");
    assert!(plan.enforced().network_isolated);
    let out = run(&isolated, cwd.path(), &script);
    let shown = text(&out);
    for name in ["tcp", "mptcp", "udp", "abstract", "dns"] {
        assert!(
            shown.contains(&format!("{name}: closed")),
            "{name}: {shown}"
        );
    }
    assert!(shown.contains("own loopback: OPEN"), "{shown}");

    // Not isolated, TCP, MPTCP, UDP and the abstract socket are reached: the probe works.
    let out = run(&workspace(&[cwd.path()], true), cwd.path(), &script);
    let shown = text(&out);
    for name in ["tcp", "mptcp", "udp", "abstract"] {
        assert!(shown.contains(&format!("{name}: OPEN")), "{name}: {shown}");
    }
    drop(abstract_listener);
    answer.join().expect("echo thread");
}

#[test]
fn a_hidden_path_inside_another_is_covered_with_it() {
    let cwd = tempfile::tempdir().expect("cwd");
    let outer = tempfile::tempdir().expect("outer");
    let inner = outer.path().join("inner");
    std::fs::create_dir(&inner).expect("inner");
    std::fs::write(inner.join("daemon.json"), "secret").expect("file");
    let mut spec = workspace(&[cwd.path()], true);
    spec.hidden = vec![inner.clone(), outer.path().to_path_buf(), inner.clone()];
    let out = run(
        &spec,
        cwd.path(),
        &format!("cat {}", inner.join("daemon.json").display()),
    );
    assert!(!text(&out).contains("secret"), "{}", text(&out));
    assert!(run(&spec, cwd.path(), "true").status.success());
}
