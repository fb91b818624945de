//! The web dashboard in a real headless Chromium, driven over WebDriver by the
//! `chromedriver` of Debian's `chromium-driver` (`.ci/run` installs both), against the real
//! daemon and a mock model: a one-time login link from `drover ui`, a streamed answer, an
//! approval answered with its button, an `always` answer confirmed with its scope and listed on
//! the Approvals page, the marks of failed, denied, interrupted and lost turns, a job's status
//! changing, the reconnect path, a restart's epoch change, and a page of another
//! origin refused at the WebSocket upgrade.
//!
//! With `DROVER_WRITE_DASHBOARD_SCREENSHOTS=1` each page is also saved as
//! `docs/img/dashboard-<page>.png` (docs/dashboard.md shows them).

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::common::bin;
use drover_test_support::harness::{
    children_of, daemon_info, run_drover, script_rm_victim, signal, Client, Daemon,
    KillDaemonOnDrop, TestHome,
};
use drover_test_support::{Gate, MockModel, Reply};
use fantoccini::{ClientBuilder, Locator};
use serde_json::{json, Value};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// The longest any one wait for the page may take.
const BOUND: Duration = Duration::from_secs(30);

/// A free loopback port (bound, then released for the process that will listen on it).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A headless Chromium under its own `chromedriver`, with a fresh profile. The driver runs in
/// its own process group, which is killed and reaped on drop.
struct Browser {
    client: fantoccini::Client,
    driver: Child,
    _profile: tempfile::TempDir,
}

impl Browser {
    async fn start() -> Browser {
        assert!(
            Path::new(CHROMIUM).exists() && Path::new(CHROMEDRIVER).exists(),
            "the dashboard tests need a headless Chromium: {CHROMIUM} and {CHROMEDRIVER} are \
             missing (apt-get install chromium chromium-driver; .ci/run installs them)"
        );
        let profile = tempfile::Builder::new()
            .prefix("drover-chromium-")
            .tempdir()
            .unwrap();
        let port = free_port();
        let driver = std::process::Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("chromedriver starts");
        let mut caps = serde_json::Map::new();
        caps.insert("browserName".into(), json!("chrome"));
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": CHROMIUM,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    "--disable-dev-shm-usage", "--window-size=1280,900",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            }),
        );
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + BOUND;
        let browser = Browser {
            client: loop {
                // chromedriver takes a moment to listen.
                match ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
                    .capabilities(caps.clone())
                    .connect(&url)
                    .await
                {
                    Ok(c) => break c,
                    Err(e) if Instant::now() > deadline => {
                        panic!("no WebDriver session from {CHROMEDRIVER} within {BOUND:?}: {e}")
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            },
            driver,
            _profile: profile,
        };
        browser.client.set_window_size(1280, 900).await.unwrap();
        browser
    }

    async fn goto(&self, url: &str) {
        self.client.goto(url).await.unwrap();
    }

    /// The text of the first element matching `css`, if there is one.
    async fn text(&self, css: &str) -> Option<String> {
        match self.client.find(Locator::Css(css)).await {
            Ok(el) => el.text().await.ok(),
            Err(_) => None,
        }
    }

    /// One more poll of a wait that began at `started`: past [`BOUND`], panics with what
    /// `failed` says and what the page says; before it, sleeps a moment.
    async fn poll(&self, started: Instant, failed: impl FnOnce() -> String) {
        if started.elapsed() > BOUND {
            let body = self.text("body").await.unwrap_or_default();
            panic!("{}; the page says:\n{body}", failed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    /// Waits until an element matching `css` has text that `pred` accepts; returns that text.
    async fn wait_text(&self, css: &str, pred: impl Fn(&str) -> bool) -> String {
        let started = Instant::now();
        loop {
            let text = self.text(css).await;
            if let Some(t) = &text {
                if pred(t) {
                    return t.clone();
                }
            }
            self.poll(started, || {
                format!("{css}: {text:?} never matched within {BOUND:?}")
            })
            .await;
        }
    }

    /// Waits until `css` matches an element.
    async fn wait_for(&self, css: &str) -> fantoccini::elements::Element {
        let started = Instant::now();
        loop {
            if let Ok(el) = self.client.find(Locator::Css(css)).await {
                return el;
            }
            self.poll(started, || format!("{css} never appeared within {BOUND:?}"))
                .await;
        }
    }

    /// Waits until `css` matches nothing.
    async fn wait_gone(&self, css: &str) {
        let started = Instant::now();
        while self.client.find(Locator::Css(css)).await.is_ok() {
            self.poll(started, || format!("{css} still there after {BOUND:?}"))
                .await;
        }
    }

    /// Clicks the element `css` matches. The page re-renders parts of itself as events come
    /// in, so an element found a moment ago may be gone (stale) by the click: a click the
    /// browser refused is tried again on the element found anew.
    async fn click(&self, css: &str) {
        let deadline = Instant::now() + BOUND;
        loop {
            let refused = match self.wait_for(css).await.click().await {
                Ok(()) => return,
                Err(e) => e,
            };
            if Instant::now() > deadline {
                panic!("{css} could not be clicked within {BOUND:?}: {refused}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Types `text` into the session page's input and presses Send.
    async fn send(&self, text: &str) {
        self.wait_for("#input").await.send_keys(text).await.unwrap();
        self.click("#send").await;
    }

    async fn js(&self, script: &str) -> Value {
        self.client.execute(script, vec![]).await.unwrap()
    }

    /// Waits until the page's connection is `state` (`connected`, `disconnected`).
    async fn wait_conn(&self, state: &str) {
        self.wait_for(&format!("body[data-conn={state}]")).await;
    }

    /// Saves the page as `docs/img/dashboard-<name>.png` when asked to.
    async fn shot(&self, name: &str) {
        if std::env::var_os("DROVER_WRITE_DASHBOARD_SCREENSHOTS").is_none() {
            return;
        }
        // Let the last render and the fonts settle.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let png = self.client.screenshot().await.unwrap();
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/img");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("dashboard-{name}.png")), png).unwrap();
    }

    /// Ends the WebDriver session (the browser quits), then the driver (on drop).
    async fn quit(self) {
        let _ = tokio::time::timeout(Duration::from_secs(10), self.client.clone().close()).await;
    }
}

/// Every process below `pid`, children first found first.
fn descendants(pid: u32) -> Vec<u32> {
    let mut all = children_of(pid);
    let mut i = 0;
    while i < all.len() {
        let below = children_of(all[i]);
        all.extend(below);
        i += 1;
    }
    all
}

/// SIGKILLs the driver, its process group and every process below it (the browser, which may
/// have left the group), and reaps the driver.
fn kill_group(driver: &mut Child) {
    let below = descendants(driver.id());
    if let Ok(pid) = i32::try_from(driver.id()) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    for pid in below {
        signal(pid, nix::sys::signal::Signal::SIGKILL);
    }
    let _ = driver.kill();
    let _ = driver.wait();
}

impl Drop for Browser {
    fn drop(&mut self) {
        kill_group(&mut self.driver);
    }
}

/// `drover ui --no-open --json`: the one-time login link.
async fn login_link(home: &Path) -> String {
    let out = run_drover(bin(), home, None, &["ui", "--no-open", "--json"]).await;
    assert!(
        out.status.success(),
        "drover ui failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["url"].as_str().unwrap().to_string()
}

/// A browser logged in to the dashboard of `home`, on session `sid`'s page; and its login
/// link.
async fn session_page(home: &Path, sid: &str) -> (Browser, String) {
    let browser = Browser::start().await;
    let link = login_link(home).await;
    browser.goto(&link).await;
    browser.wait_conn("connected").await;
    browser
        .goto(&format!("{}/ui/#/session/{sid}", origin_of(&link)))
        .await;
    (browser, link)
}

/// A session with the terminal toolset in `cwd`, made by `c` as `request_id`; its id.
async fn terminal_session(c: &mut Client, request_id: &str, cwd: &Path) -> String {
    let created = c
        .call_ok(
            "session.create",
            json!({"request_id": request_id, "cwd": cwd, "toolsets": ["terminal"]}),
        )
        .await
        .unwrap();
    created["session_id"].as_str().unwrap().to_string()
}

/// `http://127.0.0.1:<port>` of a login link.
fn origin_of(link: &str) -> String {
    link.split("/ui/").next().unwrap().to_string()
}

/// Runs `drover job ...` on the home's registry; returns stdout.
async fn job(home: &Path, args: &[&str]) -> String {
    let mut all = vec!["job"];
    all.extend_from_slice(args);
    let out = run_drover(bin(), home, None, &all).await;
    assert!(
        out.status.success(),
        "drover {all:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `drover job register` of `prompt` with a heartbeat of `heartbeat` seconds; returns its id.
async fn register(home: &Path, prompt: &str, heartbeat: u64) -> String {
    let heartbeat = heartbeat.to_string();
    job(
        home,
        &["register", "--prompt", prompt, "--heartbeat", &heartbeat],
    )
    .await
}

/// `drover job publish` of `event` (with its `--detail`, if any) for `job_id`.
async fn publish(home: &Path, job_id: &str, event: &str, detail: Option<&str>) {
    let mut args = vec!["publish", "--job", job_id, "--event", event];
    args.extend(detail.map(|d| ["--detail", d]).into_iter().flatten());
    job(home, &args).await;
}

#[tokio::test]
async fn a_browser_logs_in_once_and_watches_and_steers_sessions_and_jobs() {
    let model = MockModel::start().await;
    let home = TestHome::new().unwrap();
    // A fixed port, so the page can still reach the daemon after its restart below.
    let port = free_port();
    let echo = drover_test_support::mcp_echo_bin().display().to_string();
    home.write_model_config(
        &model.base_url(),
        true,
        &format!(
            "listen = \"127.0.0.1:{port}\"\n\n[mcp_servers.echo]\ncommand = {echo:?}\n\n\
             [pricing.mock]\ninput_per_mtok = 1000.0\noutput_per_mtok = 1000.0\n"
        ),
    )
    .unwrap();
    let scratch = tempfile::Builder::new()
        .prefix("drover-dashboard-")
        .tempdir()
        .unwrap();
    let mut daemon = Daemon::start(bin(), home.path()).await.unwrap();
    let mut c = daemon.client().await.unwrap();
    let created = c
        .call_ok(
            "session.create",
            json!({"request_id": "dashboard-demo", "cwd": scratch.path(), "toolsets": ["terminal", "echo"], "title": "Tidy the build cache"}),
        )
        .await
        .unwrap();
    let sid = created["session_id"].as_str().unwrap().to_string();
    model.push(
        Reply::text("The cache is under `target/`; it holds **4.2 GB**.").usage(812, 37, 849),
    );
    c.complete_turn(&sid, "How big is the build cache?")
        .await
        .unwrap();

    let browser = Browser::start().await;
    let link = login_link(home.path()).await;
    let origin = origin_of(&link);
    assert_eq!(origin, format!("http://127.0.0.1:{port}"));

    // The link logs in, and lands on the session list.
    browser.goto(&link).await;
    browser.wait_conn("connected").await;
    let row = format!("tr[data-session=\"{sid}\"]");
    let listed = browser
        .wait_text(&row, |t| t.contains("Tidy the build cache"))
        .await;
    // Its tokens, and their cost at 1000 USD per million.
    assert!(
        listed.contains("idle") && listed.contains("849") && listed.contains("$0.8490"),
        "{listed}"
    );
    let current = browser.client.current_url().await.unwrap();
    assert_eq!(
        current.path(),
        "/ui/",
        "the code stays out of the address bar"
    );
    // Its code is spent.
    browser.goto(&link).await;
    browser
        .wait_text("#refusal", |t| t.contains("not valid"))
        .await;

    // A streamed answer shows while its turn runs, and the Interrupt button stops it.
    browser.goto(&format!("{origin}/ui/#/session/{sid}")).await;
    browser.wait_conn("connected").await;
    browser.wait_for("#transcript .msg.assistant").await;
    // The session's spend, turn by turn, and its total.
    let spend = browser
        .wait_text("#spend tr.spend-total", |t| t.contains("849"))
        .await;
    assert!(spend.contains("$0.8490"), "{spend}");
    let turn = browser
        .wait_text("#spend tr.spend-turn", |t| !t.is_empty())
        .await;
    assert!(turn.contains("812") && turn.contains("37"), "{turn}");
    model.push(
        Reply::text("Scanning target/debug/incremental for stale artefacts").stall_after_text(),
    );
    browser.send("List what can go").await;
    browser
        .wait_text("#live-text", |t| {
            t.contains("Scanning target/debug/incremental")
        })
        .await;
    browser.wait_for("#interrupt:not([disabled])").await;
    browser.shot("streaming").await;
    browser.click("#interrupt").await;
    browser.wait_gone("#live .msg").await;
    browser.wait_for("#session [data-state=idle]").await;

    // An answer in Markdown.
    model.push(Reply::text(
        "## Plan\n\n1. Keep `target/release`\n2. Delete the **incremental** caches\n\nShall I go ahead?",
    ));
    browser.send("Make a plan").await;
    browser
        .wait_text("#transcript .msg.assistant:last-child strong", |t| {
            t == "incremental"
        })
        .await;
    browser
        .wait_text("#transcript .msg.assistant:last-child code", |t| {
            t == "target/release"
        })
        .await;

    // An `rm -rf` waits for approval; the button answers it and the turn finishes.
    let victim = script_rm_victim(&model, scratch.path(), "Deleted the **victim** directory.");
    browser.send("Delete the victim directory").await;
    let card = browser
        .wait_text(".prompt[data-kind=approval]", |t| t.contains("rm -rf"))
        .await;
    assert!(
        card.contains("Allow once") && card.contains("Deny"),
        "{card}"
    );
    assert!(victim.exists(), "nothing runs before the answer");
    browser.shot("approval").await;
    // The list says why the session waits.
    browser.goto(&format!("{origin}/ui/#/sessions")).await;
    browser
        .wait_text(&row, |t| t.contains("waiting for approval"))
        .await;
    browser.shot("sessions").await;
    browser.goto(&format!("{origin}/ui/#/session/{sid}")).await;
    browser
        .click(".prompt[data-kind=approval] button[data-choice=once]")
        .await;
    browser
        .wait_text("#transcript .msg.assistant:last-child", |t| {
            t.contains("Deleted the victim directory.")
        })
        .await;
    browser.wait_gone(".prompt").await;
    assert!(!victim.exists(), "the approved rm -rf ran");
    // Its block says how it was approved.
    browser
        .wait_text(
            "#transcript details.tool[data-approval=once] summary",
            |t| t.contains("approved once"),
        )
        .await;
    // Its tool call is a block with the arguments and the result.
    browser
        .click("#transcript details.tool[data-tool=terminal] summary")
        .await;
    browser
        .wait_text("#transcript details.tool[open] .result", |t| !t.is_empty())
        .await;
    browser
        .js("document.querySelector('#transcript details.tool[open]').scrollIntoView({block: 'center'})")
        .await;
    browser.shot("session").await;

    // Away and back: events of a turn that ran meanwhile come from the stored stream.
    browser.js("window.droverDashboard.hold()").await;
    browser.wait_conn("disconnected").await;
    model.push(Reply::text("Answered while the page was away."));
    c.complete_turn(&sid, "Anything else?").await.unwrap();
    browser.js("window.droverDashboard.release()").await;
    browser
        .wait_text("#transcript", |t| {
            t.contains("Answered while the page was away.")
        })
        .await;
    let caught_up = browser.wait_for("#session[data-caught-up]").await;
    let missed: u64 = caught_up
        .attr("data-caught-up")
        .await
        .unwrap()
        .unwrap()
        .parse()
        .unwrap();
    assert!(missed > 0, "no event came from session.events.since");

    // A turn whose worker dies is `unknown` and holds the queue: Cancel takes a queued input
    // off, and Resolve unknown lets the queue go on.
    let gate = Gate::new();
    model.push(Reply::text("never delivered").gated(&gate));
    browser.send("Check the disk").await;
    assert!(
        gate.wait_reached(BOUND).await,
        "the turn never asked the model"
    );
    let worker = daemon.wait_worker().await.unwrap();
    signal(worker, nix::sys::signal::Signal::SIGKILL);
    browser
        .wait_for("#session [data-state=paused_unknown]")
        .await;
    browser.send("Queued behind it").await;
    browser
        .click("#pending li[data-status=queued] button")
        .await;
    browser.wait_gone("#pending li[data-status=queued]").await;
    browser.click("#resolve").await;
    browser.wait_for("#session [data-state=idle]").await;
    browser.wait_gone("#pending li").await;
    gate.open();

    // Jobs: a job's status changes on the page as its agent publishes.
    let jid = register(home.path(), "Refactor the config parser", 10).await;
    let other = register(home.path(), "Review the parser refactor", 30).await;
    browser.goto(&format!("{origin}/ui/#/jobs")).await;
    let job_row = format!("tr[data-job=\"{jid}\"] .job-status");
    browser.wait_text(&job_row, |t| t.contains("pending")).await;
    publish(home.path(), &jid, "started", None).await;
    browser.wait_text(&job_row, |t| t.contains("running")).await;
    publish(home.path(), &jid, "progress", Some("tests pass")).await;
    publish(home.path(), &jid, "completed", Some("parser refactored")).await;
    browser
        .wait_text(&job_row, |t| t.contains("completed"))
        .await;
    publish(home.path(), &other, "started", None).await;
    browser
        .wait_text(&format!("tr[data-job=\"{other}\"] .job-status"), |t| {
            t.contains("running")
        })
        .await;
    browser.shot("jobs").await;
    browser.goto(&format!("{origin}/ui/#/job/{jid}")).await;
    browser
        .wait_text("#job table", |t| {
            t.contains("parser refactored") && t.contains("started")
        })
        .await;
    browser.shot("job").await;

    // A background process, and the MCP servers.
    model.push(Reply::tool_call(
        "call_echo",
        "mcp__echo__echo",
        json!({"text": "watching"}),
    ));
    model.push(Reply::tool_call(
        "call_bg",
        "terminal",
        json!({"command": "sleep 120", "background": true}),
    ));
    model.push(Reply::text("Started the watcher in the background."));
    c.complete_turn(&sid, "Start a watcher").await.unwrap();
    browser.goto(&format!("{origin}/ui/#/processes")).await;
    browser
        .wait_text("#processes table", |t| {
            t.contains("sleep 120") && t.contains("running")
        })
        .await;
    browser.shot("processes").await;
    let snap = c
        .call_ok("session.resume", json!({"session_id": sid}))
        .await
        .unwrap();
    for p in snap["processes"].as_array().unwrap() {
        let pid = p["pid"].as_i64().unwrap() as i32;
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    browser.goto(&format!("{origin}/ui/#/mcp")).await;
    browser
        .wait_text("tr[data-server=echo]", |t| t.contains("mcp__echo__echo"))
        .await;
    browser.shot("mcp").await;

    // A restart: the page sees the new epoch, and that its login ended with the old start.
    browser.goto(&format!("{origin}/ui/#/sessions")).await;
    browser
        .wait_text("#daemon", |t| t.contains("epoch 1"))
        .await;
    drop(c);
    daemon.kill().unwrap();
    let daemon = Daemon::start(bin(), home.path()).await.unwrap();
    assert_eq!(daemon.epoch(), 2);
    browser
        .wait_text("#banner", |t| t.contains("restarted: epoch 1 → 2"))
        .await;
    browser.wait_for("#daemon[data-epoch=\"2\"]").await;
    // A new link logs in again, and the page still says what changed.
    let link = login_link(home.path()).await;
    browser.goto(&link).await;
    browser.wait_conn("connected").await;
    browser
        .wait_text("#banner", |t| t.contains("restarted: epoch 1 → 2"))
        .await;
    browser
        .wait_text(&row, |t| t.contains("Tidy the build cache"))
        .await;
    browser.quit().await;
}

#[tokio::test]
async fn a_login_link_works_once_and_expires() {
    let home = TestHome::new().unwrap();
    let _daemon = Daemon::start_with_env(bin(), home.path(), &[("DROVER_UI_LOGIN_TTL_S", "1")])
        .await
        .unwrap();
    let browser = Browser::start().await;
    let first = login_link(home.path()).await;
    let stale = login_link(home.path()).await;
    browser.goto(&first).await;
    browser.wait_conn("connected").await;
    browser.goto(&first).await;
    browser
        .wait_text("#refusal", |t| t.contains("not valid"))
        .await;
    // The second link was made with the first; by now it is past its second.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    browser.goto(&stale).await;
    browser
        .wait_text("#refusal", |t| t.contains("expired"))
        .await;
    // And an expired code is spent too.
    browser.goto(&stale).await;
    browser
        .wait_text("#refusal", |t| t.contains("not valid"))
        .await;
    browser.quit().await;
}

/// A page served from another origin: it tries to open the daemon's WebSocket from the
/// logged-in browser, and says whether it opened.
const FOREIGN_PAGE: &str = r#"<!doctype html><meta charset=utf-8><title>elsewhere</title>
<p id=result>trying</p>
<script>
const ws = new WebSocket(new URLSearchParams(location.search).get("ws"));
ws.onopen = () => { document.getElementById("result").textContent = "open"; };
ws.onclose = () => {
  const r = document.getElementById("result");
  if (r.textContent === "trying") r.textContent = "refused";
};
</script>"#;

/// Serves [`FOREIGN_PAGE`] to every request on `listener` (a thread; it ends with the test);
/// the requests it got (their heads) go to `seen`.
fn serve_foreign_page(listener: TcpListener, seen: std::sync::Arc<std::sync::Mutex<String>>) {
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { break };
            let mut buf = [0u8; 4096];
            let n = s.read(&mut buf).unwrap_or(0);
            if let Ok(mut seen) = seen.lock() {
                seen.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{FOREIGN_PAGE}",
                FOREIGN_PAGE.len()
            );
        }
    });
}

/// A connection to `addr` that has sent `request`; its reads give up after 10 s.
fn sent(addr: impl ToSocketAddrs, request: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    s
}

/// The status code the daemon answers a WebSocket upgrade with these extra header lines.
fn upgrade_status(addr: SocketAddr, extra: &str) -> u16 {
    let mut s = sent(
        addr,
        &format!(
            "GET /v1/ws HTTP/1.1\r\nHost: {addr}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
             Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n{extra}\r\n"
        ),
    );
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).unwrap_or(0) == 1 {
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    head.split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {head:?}"))
}

#[tokio::test]
async fn a_page_on_another_origin_cannot_open_the_websocket() {
    let home = TestHome::new().unwrap();
    let daemon = Daemon::start(bin(), home.path()).await.unwrap();
    let browser = Browser::start().await;
    let link = login_link(home.path()).await;
    let origin = origin_of(&link);
    browser.goto(&link).await;
    browser.wait_conn("connected").await;

    // The login is no cookie: browsers send a host's cookies to every port of it, so another
    // server on this host (a tool's dev server) would get it and could replay it.
    let cookies = browser.client.get_all_cookies().await.unwrap();
    assert!(cookies.is_empty(), "{cookies:?}");
    let credential = browser
        .js("return localStorage.getItem('drover_login')")
        .await;
    let credential = credential
        .as_str()
        .expect("the page kept its credential")
        .to_string();
    assert!(!browser
        .js("return location.href")
        .await
        .to_string()
        .contains(&credential));

    // The page of another origin (another port of the same host) is refused at the upgrade,
    // and nothing of the login reaches its server.
    let foreign = TcpListener::bind("127.0.0.1:0").unwrap();
    let foreign_origin = format!("http://{}", foreign.local_addr().unwrap());
    let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    serve_foreign_page(foreign, seen.clone());
    let ws = format!("{}/v1/ws", origin.replacen("http", "ws", 1));
    browser.goto(&format!("{foreign_origin}/?ws={ws}")).await;
    let result = browser.wait_text("#result", |t| t != "trying").await;
    assert_eq!(result, "refused");
    let seen = seen.lock().unwrap().clone();
    assert!(seen.contains("GET /?ws="), "{seen}");
    assert!(
        !seen.contains(&credential) && !seen.contains("drover"),
        "{seen}"
    );

    // What the page offers, replayed by hand: the credential opens the socket only with the
    // daemon's own origin, and never without an origin; the bearer token works as before.
    let offered = format!("Sec-WebSocket-Protocol: drover.v1, drover-auth.{credential}\r\n");
    let addr: SocketAddr = origin.trim_start_matches("http://").parse().unwrap();
    let with = |origin: &str| format!("{offered}Origin: {origin}\r\n");
    assert_eq!(upgrade_status(addr, &with(&foreign_origin)), 403);
    assert_eq!(upgrade_status(addr, &with("http://localhost:1")), 403);
    assert_eq!(upgrade_status(addr, &with("null")), 403);
    assert_eq!(upgrade_status(addr, &with(&origin)), 101);
    assert_eq!(upgrade_status(addr, &format!("Origin: {origin}\r\n")), 401);
    let forged = format!(
        "Sec-WebSocket-Protocol: drover-auth.{}00\r\n",
        &credential[..credential.len() - 2]
    );
    assert_eq!(
        upgrade_status(addr, &format!("{forged}Origin: {origin}\r\n")),
        401
    );
    assert_eq!(upgrade_status(addr, &offered), 401);
    let bearer = format!("Authorization: Bearer {}\r\n", daemon.token());
    assert_eq!(upgrade_status(addr, &bearer), 101);
    assert_eq!(
        upgrade_status(addr, &format!("{bearer}Origin: {foreign_origin}\r\n")),
        403
    );

    // A logged-in page cannot mint login links for others.
    browser.goto(&format!("{origin}/ui/")).await;
    browser.wait_conn("connected").await;
    let refused = browser
        .client
        .execute_async(
            r#"const done = arguments[0];
            const ws = new WebSocket(location.origin.replace("http", "ws") + "/v1/ws",
                ["drover.v1", "drover-auth." + localStorage.getItem("drover_login")]);
            ws.onopen = () => ws.send(JSON.stringify({jsonrpc: "2.0", id: 1, method: "ui.login_code", params: {}}));
            ws.onmessage = (m) => done(JSON.parse(m.data));
            ws.onclose = () => done(null);"#,
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        refused["error"]["data"]["reason"], "permission_denied",
        "{refused}"
    );
    let mut c = Client::connect(&daemon.url(), Some(&daemon.token()))
        .await
        .unwrap();
    let minted = c.call_ok("ui.login_code", json!({})).await.unwrap();
    assert!(minted["url"]
        .as_str()
        .unwrap()
        .starts_with(&format!("{origin}/ui/login?code=")));
    browser.quit().await;
}

#[tokio::test]
async fn drover_ui_on_a_fresh_home_starts_the_daemon_and_prints_a_working_link() {
    let home = TestHome::new().unwrap();
    let _stop = KillDaemonOnDrop(home.path());
    let out = run_drover(bin(), home.path(), None, &["ui", "--no-open"]).await;
    assert!(
        out.status.success(),
        "drover ui: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let link = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let info = daemon_info(home.path()).expect("drover ui started a daemon");
    let port = info["url"]
        .as_str()
        .unwrap()
        .trim_start_matches("ws://127.0.0.1:")
        .trim_end_matches("/v1/ws")
        .to_string();
    assert!(
        link.starts_with(&format!("http://127.0.0.1:{port}/ui/login?code=")),
        "{link}"
    );
    let login = |link: &str| {
        let path = link.trim_start_matches(&format!("http://127.0.0.1:{port}"));
        let mut s = sent(
            format!("127.0.0.1:{port}"),
            &format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"),
        );
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        answer
    };
    let first = login(&link);
    assert!(first.starts_with("HTTP/1.1 303"), "{first}");
    // The credential travels in the fragment, and no cookie is set.
    assert!(first.contains("location: /ui/#/login/"), "{first}");
    assert!(
        !first.to_ascii_lowercase().contains("set-cookie"),
        "{first}"
    );
    let again = login(&link);
    assert!(again.starts_with("HTTP/1.1 403"), "{again}");
}

/// The session list pages through `session.list`: a session past its first 200 rows (an old
/// one waiting for an approval, say) is still listed. Each row names the session's agent (an
/// external one of `[agents.<name>]`, else `drover`), and so does the session's header.
#[tokio::test]
async fn the_session_list_shows_sessions_past_the_first_page() {
    let model = MockModel::start().await;
    let home = TestHome::new().unwrap();
    home.write_model_config(
        &model.base_url(),
        true,
        "[agents.codex]\ncommand = [\"codex-acp\"]\n",
    )
    .unwrap();
    let daemon = Daemon::start(bin(), home.path()).await.unwrap();
    let mut c = daemon.client().await.unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let create =
        |title: String| json!({"request_id": title, "cwd": scratch.path(), "title": title});
    let mut oldest = create("the oldest one".into());
    oldest["agent"] = json!("codex");
    let oldest = c.call_ok("session.create", oldest).await.unwrap();
    let oldest = oldest["session_id"].as_str().unwrap().to_string();
    let mut newest = String::new();
    for i in 0..205 {
        let made = c
            .call_ok("session.create", create(format!("newer {i}")))
            .await
            .unwrap();
        newest = made["session_id"].as_str().unwrap().to_string();
    }
    let browser = Browser::start().await;
    let link = login_link(home.path()).await;
    browser.goto(&link).await;
    browser.wait_conn("connected").await;
    let listed = browser
        .wait_text("#sessions", |t| t.contains("the oldest one"))
        .await;
    assert!(listed.contains("newer 204"), "{listed}");
    let agent_cell = |sid: &str| format!("tr[data-session=\"{sid}\"] td.agent");
    assert_eq!(
        browser.text(&agent_cell(&oldest)).await.as_deref(),
        Some("codex")
    );
    assert_eq!(
        browser.text(&agent_cell(&newest)).await.as_deref(),
        Some("drover")
    );
    browser
        .goto(&format!("{}/ui/#/session/{oldest}", origin_of(&link)))
        .await;
    browser
        .wait_text(".meta .agent", |t| t == "agent codex")
        .await;
    browser.quit().await;
}

/// `drover restart` under an open session page: the page reconnects to the next owner at once,
/// its banner says "daemon restarted (version X -> Y)", and the held turn's answer shows once
/// it comes (caught up from the page's last `seq`, never twice).
#[tokio::test]
async fn a_handoff_says_restarted_in_the_banner_and_the_session_page_goes_on() {
    let model = MockModel::start().await;
    let home = TestHome::new().unwrap();
    home.write_model_config(&model.base_url(), true, "")
        .unwrap();
    let daemon = Daemon::start(bin(), home.path()).await.unwrap();
    // The next owner is no child of this test: killed by its daemon.json on the way out.
    let _next = KillDaemonOnDrop(home.path());
    let mut c = daemon.client().await.unwrap();
    let created = c
        .call_ok(
            "session.create",
            json!({"request_id": "handoff", "cwd": home.work(), "title": "Across a restart"}),
        )
        .await
        .unwrap();
    let sid = created["session_id"].as_str().unwrap().to_string();
    drop(c);
    let (browser, _) = session_page(home.path(), &sid).await;
    browser.wait_conn("connected").await;
    browser
        .wait_text("#daemon", |t| {
            t.contains(&format!("epoch {}", daemon.epoch()))
        })
        .await;
    let gate = Gate::new();
    model.push(Reply::text("Answered by the **next** owner.").gated(&gate));
    browser.send("Hold on across a restart").await;
    assert!(
        gate.wait_reached(BOUND).await,
        "the turn never reached the model"
    );

    let out = run_drover(bin(), home.path(), None, &["restart"]).await;
    assert!(
        out.status.success(),
        "drover restart failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = env!("CARGO_PKG_VERSION");
    browser
        .wait_text("#banner", |t| {
            t == format!("daemon restarted (version {v} -> {v})")
        })
        .await;
    let next_epoch = daemon_info(home.path()).unwrap()["epoch"].as_u64().unwrap();
    assert!(next_epoch > daemon.epoch());
    browser
        .wait_for(&format!("#daemon[data-epoch=\"{next_epoch}\"]"))
        .await;
    browser.wait_conn("connected").await;
    gate.open();
    browser
        .wait_text("#transcript .msg.assistant:last-child strong", |t| {
            t == "next"
        })
        .await;
    browser.wait_for("#session [data-state=idle]").await;
    let transcript = browser.text("#transcript").await.unwrap();
    assert_eq!(
        transcript.matches("Answered by the").count(),
        1,
        "{transcript}"
    );
    assert_eq!(
        transcript.matches("Hold on across a restart").count(),
        1,
        "{transcript}"
    );
    let banner = browser.text("#banner").await.unwrap();
    assert!(!banner.contains("login"), "{banner}");
    browser.quit().await;
}

/// The session page says what happened to each turn: a failed turn's error, a denied call, an
/// interrupted turn and a lost (`unknown`) one, whose tool blocks stop saying `running…`, also
/// after *Resolve unknown*; a running tool is drawn once, also after the page reloaded it.
#[tokio::test]
async fn the_session_page_marks_failed_denied_interrupted_and_unknown_turns() {
    let model = MockModel::start().await;
    let home = TestHome::new().unwrap();
    home.write_model_config(&model.base_url(), true, "")
        .unwrap();
    let scratch = tempfile::Builder::new()
        .prefix("drover-dashboard-")
        .tempdir()
        .unwrap();
    let daemon = Daemon::start(bin(), home.path()).await.unwrap();
    let mut c = daemon.client().await.unwrap();
    let sid = terminal_session(&mut c, "marks", scratch.path()).await;
    let (browser, _) = session_page(home.path(), &sid).await;
    browser.wait_for("#session [data-state=idle]").await;

    // A failed turn: its outcome and the model server's error.
    model.push(Reply::error(400, "the mock refuses this prompt"));
    browser.send("Fail, please").await;
    let note = browser
        .wait_text("#last-turn[data-outcome=failed]", |t| !t.is_empty())
        .await;
    assert!(note.contains("the mock refuses this prompt"), "{note}");
    browser
        .wait_text("#turns tr[data-outcome=failed]", |t| {
            t.contains("the mock refuses this prompt")
        })
        .await;

    // A denied call says so on its block.
    let victim = script_rm_victim(&model, scratch.path(), "I left it alone.");
    browser.send("Delete the victim directory").await;
    browser
        .click(".prompt[data-kind=approval] button[data-choice=deny]")
        .await;
    browser
        .wait_text(
            "#transcript details.tool[data-approval=deny] summary",
            |t| t.contains("denied"),
        )
        .await;
    browser.wait_for("#session [data-state=idle]").await;
    assert!(victim.exists(), "the denied rm -rf did not run");

    // A running tool is drawn once, also after the page reloaded the session; an interrupt
    // closes its block and the turn says `interrupted`.
    let blocks_of = |command: &str| {
        format!(
            "return [...document.querySelectorAll('details.tool')].filter(d => d.textContent.includes('{command}')).length"
        )
    };
    model.push(Reply::terminal("call_wait", "sleep 25"));
    browser.send("Wait a while").await;
    browser
        .wait_for("#session details.tool[data-running][data-tool-id=call_wait]")
        .await;
    browser.js("window.droverDashboard.hold()").await;
    browser.wait_conn("disconnected").await;
    browser.js("window.droverDashboard.release()").await;
    browser.wait_for("#session[data-caught-up]").await;
    browser
        .wait_for("#transcript details.tool[data-running][data-tool-id=call_wait]")
        .await;
    assert_eq!(browser.js(&blocks_of("sleep 25")).await, json!(1));
    browser.click("#interrupt").await;
    browser
        .wait_for("#last-turn[data-outcome=interrupted]")
        .await;
    browser.wait_for("#session [data-state=idle]").await;
    browser
        .wait_gone("#session details.tool[data-running]")
        .await;
    assert_eq!(browser.js(&blocks_of("sleep 25")).await, json!(1));

    // A turn whose worker is killed mid-tool is `unknown`: its block says so, not `running…`,
    // before and after Resolve unknown.
    model.push(Reply::terminal("call_lost", "sleep 26"));
    browser.send("Wait again").await;
    browser
        .wait_for("#transcript details.tool[data-running][data-tool-id=call_lost]")
        .await;
    let worker = daemon.wait_worker().await.unwrap();
    signal(worker, nix::sys::signal::Signal::SIGKILL);
    browser
        .wait_for("#session [data-state=paused_unknown]")
        .await;
    let lost = browser
        .wait_text("#transcript details.tool[data-tool-id=call_lost]", |t| {
            !t.contains("running…")
        })
        .await;
    assert!(lost.contains("the turn was lost (unknown)"), "{lost}");
    browser.wait_for("#last-turn[data-outcome=unknown]").await;
    browser.click("#resolve").await;
    browser.wait_for("#session [data-state=idle]").await;
    browser
        .wait_gone("#session details.tool[data-running]")
        .await;
    let lost = browser
        .wait_text("#transcript details.tool[data-tool-id=call_lost]", |t| {
            !t.is_empty()
        })
        .await;
    assert!(lost.contains("the turn was lost (unknown)"), "{lost}");
    assert!(
        !browser.text("#session").await.unwrap().contains("running…"),
        "a block still says running…"
    );
    drop(c);
    browser.quit().await;
}

/// `drover approvals list --json`'s rules.
async fn listed_rules(home: &Path) -> Vec<Value> {
    let out = run_drover(bin(), home, None, &["approvals", "list", "--json"]).await;
    assert!(
        out.status.success(),
        "drover approvals list: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["rules"].as_array().unwrap().clone()
}

/// "Always allow…" stores nothing at once: it opens a confirmation in the page with the
/// prompt's scopes as radio choices in their words (the workspace picked); Cancel goes back,
/// Confirm stores the rule in the scope picked (here the command's directory tree, narrower than
/// the workspace), the page says what it stored, and the Approvals page lists the rule with its
/// class, scope and origin, as `drover approvals list --json` does.
#[tokio::test]
async fn always_allow_confirms_the_scope_in_the_page_and_the_rule_is_listed_with_it() {
    let model = MockModel::start().await;
    let home = TestHome::new().unwrap();
    home.write_model_config(&model.base_url(), true, "")
        .unwrap();
    let scratch = tempfile::Builder::new()
        .prefix("drover-dashboard-")
        .tempdir()
        .unwrap();
    let workspace = scratch.path().display().to_string();
    let build = scratch.path().join("build");
    let victim = build.join("victim");
    std::fs::create_dir_all(&victim).unwrap();
    let daemon = Daemon::start(bin(), home.path()).await.unwrap();
    let mut c = daemon.client().await.unwrap();
    let sid = terminal_session(&mut c, "always", scratch.path()).await;
    let (browser, link) = session_page(home.path(), &sid).await;
    browser.wait_for("#session [data-state=idle]").await;

    model.push(Reply::tool_call(
        "call_rm",
        "terminal",
        json!({"command": "rm -rf victim", "workdir": build}),
    ));
    model.push(Reply::text("Removed it."));
    browser.send("Delete the build's victim").await;
    let always = ".prompt[data-kind=approval] button[data-choice=always]";
    assert_eq!(
        browser.wait_text(always, |t| !t.is_empty()).await,
        "Always allow…"
    );
    browser.click(always).await;
    let class = "every command that deletes files recursively";
    let words = [
        format!(
            "{class}, in {} and below (this directory tree)",
            build.display()
        ),
        format!("{class}, in {workspace} and below (this workspace)"),
        format!("{class}, anywhere, in every session of this home (everywhere)"),
    ];
    let shown = browser
        .wait_text("#always-confirm", |t| t.contains("(everywhere)"))
        .await;
    for offer in &words {
        assert!(shown.contains(offer.as_str()), "{offer:?} in {shown}");
    }
    let picked = "return document.querySelector('#always-confirm input[type=radio]:checked').value";
    assert_eq!(browser.js(picked).await, json!("workspace"));
    browser.shot("always-confirm").await;
    assert!(
        listed_rules(home.path()).await.is_empty(),
        "stored before Confirm"
    );
    assert!(victim.exists(), "ran before the answer");

    // Cancel goes back to the choices, storing nothing.
    browser.click("#always-confirm-cancel").await;
    browser.wait_gone("#always-confirm").await;
    browser.click(always).await;
    browser
        .click("#always-confirm [data-scope=directory] input")
        .await;
    assert_eq!(browser.js(picked).await, json!("directory"));
    browser.click("#always-confirm-yes").await;
    let stored = browser
        .wait_text("#stored-rule[data-scope=directory]", |t| !t.is_empty())
        .await;
    assert!(
        stored.contains(&format!("Stored: always allow {}", words[0])),
        "{stored}"
    );
    browser.wait_for("#session [data-state=idle]").await;
    assert!(!victim.exists(), "the approved rm -rf ran");

    let rules = listed_rules(home.path()).await;
    assert_eq!(rules.len(), 1, "{rules:?}");
    let rule = &rules[0];
    assert_eq!(rule["scope"], "directory", "{rule}");
    assert_eq!(rule["path"], json!(build.display().to_string()), "{rule}");
    assert_eq!(rule["text"], json!(words[0]), "{rule}");
    assert_eq!(rule["origin"]["session_id"], json!(sid), "{rule}");

    // The Approvals page lists it: class, scope words and tree, origin.
    browser
        .goto(&format!("{}/ui/#/approvals", origin_of(&link)))
        .await;
    let row = format!(
        "#approvals tr[data-rule=\"{}\"]",
        rule["rule_id"].as_str().unwrap()
    );
    let listed = browser
        .wait_text(&format!("{row} .rule-scope"), |t| !t.is_empty())
        .await;
    assert!(listed.contains("this directory tree"), "{listed}");
    assert!(listed.contains(&build.display().to_string()), "{listed}");
    assert_eq!(
        browser.text(&format!("{row} .rule-class")).await.unwrap(),
        "deletes files recursively"
    );
    let all = browser.text(&row).await.unwrap();
    assert!(all.contains(&sid[..8]), "{all}");
    assert!(all.contains("rm -rf victim"), "{all}");
    browser.shot("approvals").await;
    drop(c);
    browser.quit().await;
}
