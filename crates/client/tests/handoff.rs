//! A daemon handoff as the client sees it, against a fake daemon that speaks the wire: the old
//! owner sends `daemon.restarted` and closes with 1012, the next owner serves on the same
//! address once it rewrote `daemon.json`. The stream goes on with no gap and no repeat, the
//! caller hears "daemon restarted (version X -> Y)" and never "lost", and the client neither
//! starts a daemon nor settles for the old owner's `daemon.json`. And a reconnect's catch-up
//! reads back only what was stored before the session was attached again: what comes live
//! after (a turn's deltas, then its stored events) keeps the order the daemon sent it in.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_client::{Client, ConnectOptions, ConnectionChange, StartDaemon, Update};
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;

const SESSION: &str = "s-1";
const REPLAY: &str = "replay-1";
const TOKEN: &str = "the-token";
/// The bound of every wait here.
const BOUND: Duration = Duration::from_secs(10);

fn event(seq: u64) -> Value {
    json!({
        "session_id": SESSION, "seq": seq, "replay_epoch": REPLAY,
        "type": "test.tick", "payload": {"n": seq},
    })
}

/// A live `message.delta` (no `seq`).
fn delta() -> Value {
    json!({
        "session_id": SESSION, "seq": null, "replay_epoch": REPLAY,
        "type": "message.delta", "payload": {"text": "hi", "delta_index": 0},
    })
}

/// The stream's events as `seq`s, a delta as "delta".
fn order(seen: &[Update]) -> Vec<String> {
    seen.iter()
        .filter_map(|u| match u {
            Update::Event(e) => Some(e.seq.map_or_else(|| "delta".to_string(), |s| s.to_string())),
            _ => None,
        })
        .collect()
}

fn write_daemon_json(home: &Path, url: &str, epoch: u64, instance: &str) {
    let info = json!({
        "pid": std::process::id(), "epoch": epoch, "instance_id": instance,
        "url": url, "token": TOKEN, "started_at": 0.0,
    });
    // Written whole, then renamed: a reader never sees half a file.
    let tmp = home.join("daemon.json.tmp");
    std::fs::write(&tmp, info.to_string()).unwrap();
    std::fs::rename(tmp, home.join("daemon.json")).unwrap();
}

/// What the test tells the daemon's connection.
enum Ctrl {
    /// Store the next event and send it live.
    Event,
    /// Hand over: `daemon.restarted` (when `notice`), then close with 1012.
    Handoff { notice: bool },
    /// Send the stored event of this seq live again (a duplicate the client must drop).
    Resend(u64),
    /// Store one event without sending it (the client misses it), then store and send the
    /// next one, a live delta and the one after: all three stored before the client can ask.
    GapThenTurn,
}

/// The fake daemon's state, shared by its connections.
struct Fake {
    home: PathBuf,
    stored: Mutex<Vec<Value>>,
    /// The `daemon.json` instance each `session.resume` was answered under.
    resumed_under: Mutex<Vec<String>>,
    connections: Mutex<u32>,
    /// After answering the next `session.resume`, a turn goes on at once: a live delta, then
    /// the next event stored and sent.
    turn_after_resume: Mutex<bool>,
}

impl Fake {
    fn answer(&self, method: &str, params: &Value) -> Value {
        let stored = self.stored.lock().unwrap().clone();
        match method {
            "session.resume" => {
                let instance = std::fs::read_to_string(self.home.join("daemon.json"))
                    .ok()
                    .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                    .and_then(|v| v["instance_id"].as_str().map(str::to_string))
                    .unwrap_or_default();
                self.resumed_under.lock().unwrap().push(instance);
                let fixture: Value = serde_json::from_str(include_str!(
                    "../../protocol/tests/fixtures/methods/session.resume.json"
                ))
                .unwrap();
                let mut snapshot = fixture[0]["result"].clone();
                snapshot["session_id"] = json!(SESSION);
                snapshot["replay_epoch"] = json!(REPLAY);
                snapshot["last_sequence"] = json!(stored.len());
                snapshot
            }
            "session.events.since" => {
                let after = params["last_sequence"].as_u64().unwrap();
                let events: Vec<Value> = stored
                    .into_iter()
                    .filter(|e| e["seq"].as_u64().unwrap() > after)
                    .collect();
                let last = events.last().map_or(after, |e| e["seq"].as_u64().unwrap());
                json!({"events": events, "last_sequence": last, "replay_epoch": REPLAY,
                       "snapshot_required": false, "has_more": false})
            }
            other => panic!("the fake daemon does not serve {other}"),
        }
    }
}

/// Serves every connection to `listener`; the newest one takes the test's orders.
async fn serve(listener: TcpListener, fake: Arc<Fake>, ctrl: mpsc::UnboundedReceiver<Ctrl>) {
    let ctrl = Arc::new(tokio::sync::Mutex::new(ctrl));
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            return;
        };
        let (fake, ctrl) = (fake.clone(), ctrl.clone());
        tokio::spawn(async move {
            let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
                return;
            };
            *fake.connections.lock().unwrap() += 1;
            let mut ctrl = ctrl.lock().await;
            loop {
                tokio::select! {
                    msg = ws.next() => {
                        let Some(Ok(Message::Text(text))) = msg else { return };
                        let req: Value = serde_json::from_str(text.as_str()).unwrap();
                        let method = req["method"].as_str().unwrap();
                        let result = fake.answer(method, &req["params"]);
                        let answer = json!({"jsonrpc": "2.0", "id": req["id"], "result": result});
                        ws.send(Message::Text(answer.to_string().into())).await.unwrap();
                        let turn = method == "session.resume"
                            && std::mem::take(&mut *fake.turn_after_resume.lock().unwrap());
                        if turn {
                            let e = {
                                let mut stored = fake.stored.lock().unwrap();
                                let e = event(stored.len() as u64 + 1);
                                stored.push(e.clone());
                                e
                            };
                            for live in [delta(), e] {
                                let note = json!({"jsonrpc": "2.0", "method": "event", "params": live});
                                ws.send(Message::Text(note.to_string().into())).await.unwrap();
                            }
                        }
                    }
                    order = ctrl.recv() => match order {
                        None => return,
                        Some(Ctrl::Event) => {
                            let e = {
                                let mut stored = fake.stored.lock().unwrap();
                                let e = event(stored.len() as u64 + 1);
                                stored.push(e.clone());
                                e
                            };
                            let note = json!({"jsonrpc": "2.0", "method": "event", "params": e});
                            ws.send(Message::Text(note.to_string().into())).await.unwrap();
                        }
                        Some(Ctrl::GapThenTurn) => {
                            let (third, fourth) = {
                                let mut stored = fake.stored.lock().unwrap();
                                for _ in 0..3 {
                                    let e = event(stored.len() as u64 + 1);
                                    stored.push(e);
                                }
                                let n = stored.len();
                                (stored[n - 2].clone(), stored[n - 1].clone())
                            };
                            for live in [third, delta(), fourth] {
                                let note = json!({"jsonrpc": "2.0", "method": "event", "params": live});
                                ws.send(Message::Text(note.to_string().into())).await.unwrap();
                            }
                        }
                        Some(Ctrl::Resend(seq)) => {
                            let e = fake.stored.lock().unwrap()[seq as usize - 1].clone();
                            let note = json!({"jsonrpc": "2.0", "method": "event", "params": e});
                            ws.send(Message::Text(note.to_string().into())).await.unwrap();
                        }
                        Some(Ctrl::Handoff { notice }) => {
                            if notice {
                                let note = json!({"jsonrpc": "2.0", "method": "daemon.restarted",
                                    "params": {"from_version": "0.1.0", "to_version": "0.2.0", "epoch": 2}});
                                ws.send(Message::Text(note.to_string().into())).await.unwrap();
                            }
                            let frame = CloseFrame {
                                code: CloseCode::from(1012),
                                reason: "the daemon restarted (version 0.1.0 -> 0.3.0)".into(),
                            };
                            let _ = ws.close(Some(frame)).await;
                            // Drain until the client's close: the connection ends cleanly.
                            while let Some(Ok(_)) = ws.next().await {}
                            return;
                        }
                    },
                }
            }
        });
    }
}

struct Setup {
    _dir: tempfile::TempDir,
    home: PathBuf,
    url: String,
    fake: Arc<Fake>,
    ctrl: mpsc::UnboundedSender<Ctrl>,
}

async fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().to_path_buf();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/v1/ws", listener.local_addr().unwrap());
    write_daemon_json(&home, &url, 1, "one");
    let fake = Arc::new(Fake {
        home: home.clone(),
        stored: Mutex::new(Vec::new()),
        resumed_under: Mutex::new(Vec::new()),
        connections: Mutex::new(0),
        turn_after_resume: Mutex::new(false),
    });
    let (ctrl, rx) = mpsc::unbounded_channel();
    tokio::spawn(serve(listener, fake.clone(), rx));
    Setup {
        _dir: dir,
        home,
        url,
        fake,
        ctrl,
    }
}

/// A client that never starts a daemon, attached to the session, having read its first event.
async fn attached_after_one_event(
    s: &Setup,
) -> (Client, drover_client::SessionStream, Vec<Update>) {
    let mut options = ConnectOptions::new(&s.home, StartDaemon::Never);
    options.reconnect_for = BOUND;
    let client = Client::connect(options).await.unwrap();
    let mut stream = client.attach(SESSION).await.unwrap();
    let mut seen = Vec::new();
    s.ctrl.send(Ctrl::Event).unwrap();
    until_seq(&mut stream, 1, &mut seen).await;
    (client, stream, seen)
}

/// Reads the stream until the event of `seq`, keeping every update (bounded).
async fn until_seq(stream: &mut drover_client::SessionStream, seq: u64, seen: &mut Vec<Update>) {
    tokio::time::timeout(BOUND, async {
        loop {
            let update = stream.next().await.expect("the stream goes on").unwrap();
            let done = matches!(&update, Update::Event(e) if e.seq == Some(seq));
            seen.push(update);
            if done {
                return;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no event {seq} within {BOUND:?}; saw {seen:#?}"));
}

fn seqs(seen: &[Update]) -> Vec<u64> {
    seen.iter()
        .filter_map(|u| match u {
            Update::Event(e) => e.seq,
            _ => None,
        })
        .collect()
}

fn changes(seen: &[Update]) -> Vec<ConnectionChange> {
    seen.iter()
        .filter_map(|u| match u {
            Update::Connection(c) => Some(c.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_handoff_notice_reconnects_to_the_next_owner_without_a_gap_or_a_repeat() {
    let s = setup().await;
    // Were the client to start a daemon, this program would fail to run, and say so as `Lost`.
    let mut options = ConnectOptions::new(
        &s.home,
        StartDaemon::Spawn {
            program: s.home.join("no-such-drover"),
        },
    );
    options.reconnect_for = BOUND;
    let client = Client::connect(options).await.unwrap();
    let mut stream = client.attach(SESSION).await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..3 {
        s.ctrl.send(Ctrl::Event).unwrap();
    }
    until_seq(&mut stream, 3, &mut seen).await;

    // The handoff: the old owner's daemon.json is gone until the next owner writes its own.
    std::fs::remove_file(s.home.join("daemon.json")).unwrap();
    s.ctrl.send(Ctrl::Handoff { notice: true }).unwrap();
    // Stored while no client was connected: read back with session.events.since.
    for seq in 4..=5 {
        s.fake.stored.lock().unwrap().push(event(seq));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    write_daemon_json(&s.home, &s.url, 2, "two");
    until_seq(&mut stream, 5, &mut seen).await;
    // Live again on the next owner's connection, with a duplicate first.
    s.ctrl.send(Ctrl::Resend(5)).unwrap();
    s.ctrl.send(Ctrl::Event).unwrap();
    until_seq(&mut stream, 6, &mut seen).await;

    assert_eq!(seqs(&seen), [1, 2, 3, 4, 5, 6]);
    let restarted = ConnectionChange::Restarted {
        from_version: "0.1.0".into(),
        to_version: "0.2.0".into(),
        epoch: 2,
    };
    assert_eq!(
        changes(&seen).as_slice(),
        std::slice::from_ref(&restarted),
        "{seen:#?}"
    );
    assert_eq!(
        restarted.to_string(),
        "daemon restarted (version 0.1.0 -> 0.2.0)"
    );
    assert_eq!(client.daemon().instance_id, "two");
    assert!(!s.home.join("logs").exists(), "the client started a daemon");
}

#[tokio::test]
async fn a_restart_close_alone_waits_for_the_next_owners_daemon_json() {
    let s = setup().await;
    let (_client, mut stream, mut seen) = attached_after_one_event(&s).await;

    // No notice (missed), and the old owner's daemon.json stays a while: it names the same
    // address, which answers, but the client waits for the next owner's file.
    s.ctrl.send(Ctrl::Handoff { notice: false }).unwrap();
    s.fake.stored.lock().unwrap().push(event(2));
    tokio::time::sleep(Duration::from_millis(400)).await;
    write_daemon_json(&s.home, &s.url, 2, "two");
    until_seq(&mut stream, 2, &mut seen).await;

    assert_eq!(seqs(&seen), [1, 2]);
    // The versions come from the close's reason; the epoch from the next daemon.json.
    assert_eq!(
        changes(&seen),
        [ConnectionChange::Restarted {
            from_version: "0.1.0".into(),
            to_version: "0.3.0".into(),
            epoch: 2,
        }]
    );
    let resumed = s.fake.resumed_under.lock().unwrap().clone();
    assert_eq!(
        resumed,
        ["one", "two"],
        "re-attached before the next owner wrote daemon.json"
    );
    assert!(*s.fake.connections.lock().unwrap() >= 2);
}

#[tokio::test]
async fn a_reconnect_reads_back_only_what_was_stored_before_the_session_was_attached_again() {
    let s = setup().await;
    let (_client, mut stream, mut seen) = attached_after_one_event(&s).await;

    // Stored while the client was away (read back), then, once the session is attached again,
    // a turn runs at once: its delta and its next stored event come live, and the event is
    // stored before the client asks what it missed.
    std::fs::remove_file(s.home.join("daemon.json")).unwrap();
    s.ctrl.send(Ctrl::Handoff { notice: true }).unwrap();
    s.fake.stored.lock().unwrap().push(event(2));
    *s.fake.turn_after_resume.lock().unwrap() = true;
    write_daemon_json(&s.home, &s.url, 2, "two");
    until_seq(&mut stream, 3, &mut seen).await;

    // In the daemon's order: what was missed, then the delta, then the event that followed
    // it; not the event read back ahead of the delta (a client showing the turn's text would
    // show it twice).
    assert_eq!(order(&seen), ["1", "2", "delta", "3"], "{seen:#?}");
}

#[tokio::test]
async fn a_gap_is_read_back_up_to_the_event_that_showed_it_and_no_further() {
    let s = setup().await;
    let (_client, mut stream, mut seen) = attached_after_one_event(&s).await;

    // 2 is missed; 3 shows the gap; a delta and 4 follow it live, 4 stored before the client
    // asks for what it missed.
    s.ctrl.send(Ctrl::GapThenTurn).unwrap();
    until_seq(&mut stream, 4, &mut seen).await;
    assert_eq!(order(&seen), ["1", "2", "3", "delta", "4"], "{seen:#?}");
}
