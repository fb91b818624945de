//! `drover_client` against the real daemon: a `SessionStream` survives an
//! owner SIGKILL and the restart the client does itself, yielding every stored event once and
//! in `seq` order; a daemon that cannot start says why in the client's error.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use crate::common::bin;
use drover_client::{Client, ClientError, ConnectOptions, ConnectionChange, StartDaemon, Update};
use drover_protocol::client::{
    CompactionResult, CompactionStatus, NoParams, Pong, SessionCreateParams,
};
use drover_protocol::event::{EventPayload, SessionEvent, TurnEnd};
use drover_protocol::ClientRequest;
use drover_test_support::harness::{
    daemon_info, model_home, run_drover, signal, KillDaemonOnDrop, TestHome,
};
use drover_test_support::{Gate, MockModel, Reply};

const BOUND: Duration = Duration::from_secs(30);

fn options(home: &Path) -> ConnectOptions {
    ConnectOptions::new(
        home,
        StartDaemon::Spawn {
            program: bin().to_path_buf(),
        },
    )
}

fn create(cwd: &Path) -> SessionCreateParams {
    SessionCreateParams::in_cwd(uuid::Uuid::new_v4().to_string(), cwd.display().to_string())
}

/// The stream's next update, within the bound.
/// A client of `home`'s daemon (started for it), a new session's id, and that session's
/// stream, attached.
async fn client_following_a_new_session(
    home: &TestHome,
) -> (Client, String, drover_client::SessionStream) {
    let client = Client::connect(options(home.path())).await.unwrap();
    let session = client.create_session(create(home.work())).await.unwrap();
    let stream = client.attach(&session.session_id).await.unwrap();
    (client, session.session_id, stream)
}

async fn next_update(stream: &mut drover_client::SessionStream) -> Update {
    tokio::time::timeout(BOUND, stream.next())
        .await
        .expect("no update within the bound")
        .expect("the stream ended")
        .expect("an update")
}

/// Reads the stream until the turn of `admission_id` settles; returns the stored events seen
/// and whether a reconnect to a restarted daemon was reported.
async fn until_settled(
    stream: &mut drover_client::SessionStream,
    admission_id: &str,
    stored: &mut Vec<SessionEvent>,
) -> (TurnEnd, bool) {
    let mut restarted = false;
    loop {
        let update = next_update(stream).await;
        match update {
            Update::Event(e) => {
                let settled = match &e.event {
                    EventPayload::TurnSettled(p) if p.admission_id == admission_id => {
                        Some(p.outcome)
                    }
                    _ => None,
                };
                if e.seq.is_some() {
                    stored.push(e);
                }
                if let Some(outcome) = settled {
                    return (outcome, restarted);
                }
            }
            Update::Connection(ConnectionChange::Reconnected { restarted: r, .. }) => {
                restarted |= r
            }
            Update::Connection(_) => {}
            Update::Snapshot(s) => panic!("the stream could resume, yet a snapshot came: {s:?}"),
        }
    }
}

/// Scripts `answer` on the model, submits `text` to the stream's session and reads `stream`
/// until that turn settles, which must be `completed`; the stored events read go to `stored`.
/// Returns the turn's admission id.
async fn completed_turn(
    model: &MockModel,
    client: &Client,
    stream: &mut drover_client::SessionStream,
    text: &str,
    answer: &str,
    stored: &mut Vec<SessionEvent>,
) -> String {
    model.push(Reply::text(answer));
    let id = stream.session_id().to_string();
    let receipt = client.submit(&id, text).await.unwrap();
    let (end, _) = until_settled(stream, &receipt.admission_id, stored).await;
    assert_eq!(end, TurnEnd::Completed, "the turn of {text:?}");
    receipt.admission_id
}

#[tokio::test]
async fn a_session_stream_yields_every_stored_event_once_in_order_across_an_owner_restart() {
    let (model, home) = model_home(true).await.unwrap();
    let _guard = KillDaemonOnDrop(home.path());
    let (client, id, mut stream) = client_following_a_new_session(&home).await;
    let first = client.daemon();
    let mut stored = Vec::new();

    completed_turn(&model, &client, &mut stream, "first", "one", &mut stored).await;

    // The second turn holds at the model; the owner dies under it.
    let gate = Gate::new();
    model.push(Reply::text("never delivered").gated(&gate));
    let b = client.submit(&id, "second").await.unwrap();
    assert!(
        gate.wait_reached(BOUND).await,
        "the model request never came"
    );
    signal(first.pid, nix::sys::signal::Signal::SIGKILL);
    let (end, restarted) = until_settled(&mut stream, &b.admission_id, &mut stored).await;
    assert_eq!(end, TurnEnd::Unknown);
    assert!(restarted, "the stream said the daemon restarted");
    let second = client.daemon();
    assert_ne!(second.instance_id, first.instance_id);
    assert!(second.epoch > first.epoch);

    // The same handle goes on against the new daemon: resolve, then one more turn.
    client.resolve_unknown(&id, &b.admission_id).await.unwrap();
    completed_turn(&model, &client, &mut stream, "third", "three", &mut stored).await;

    let seqs: Vec<u64> = stored.iter().map(|e| e.seq.unwrap()).collect();
    let expected: Vec<u64> = (seqs[0]..seqs[0] + seqs.len() as u64).collect();
    assert_eq!(seqs, expected, "every stored event once, in order");
    // ... and they are the stored stream itself.
    let epoch = stream.snapshot().replay_epoch.clone();
    let page = client
        .events_since(&id, Some(&epoch), 0, None)
        .await
        .unwrap();
    assert!(!page.snapshot_required && !page.has_more);
    let all: Vec<&SessionEvent> = page
        .events
        .iter()
        .filter(|e| e.seq.unwrap() >= seqs[0] && e.seq.unwrap() <= *seqs.last().unwrap())
        .collect();
    assert_eq!(all.len(), stored.len());
    for (got, want) in stored.iter().zip(all) {
        assert_eq!(got.seq, want.seq);
        assert_eq!(got.event, want.event);
    }
}

#[tokio::test]
async fn a_daemon_that_cannot_start_names_the_cause() {
    let home = TestHome::new().unwrap();
    let _guard = KillDaemonOnDrop(home.path());
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    home.write_config(&format!(
        "[model]\nname = \"m\"\nbase_url = \"http://127.0.0.1:1/v1\"\n[daemon]\nlisten = \"127.0.0.1:{port}\"\n"
    ))
    .unwrap();
    let e = match Client::connect(options(home.path())).await {
        Err(e) => e,
        Ok(_) => panic!("connected to a daemon that cannot listen"),
    };
    let message = e.to_string();
    assert!(matches!(e, ClientError::DaemonStart { .. }), "{message}");
    assert!(message.contains("could not start"), "{message}");
    assert!(
        message.to_lowercase().contains("address already in use"),
        "{message}"
    );

    // The CLI says the same.
    let out = run_drover(bin(), home.path(), None, &["sessions"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.to_lowercase().contains("address already in use"),
        "{stderr}"
    );
    assert!(daemon_info(home.path()).is_none());
    drop(taken);
}

#[tokio::test]
async fn never_start_on_a_home_without_a_daemon_is_not_running() {
    let home = TestHome::new().unwrap();
    let e = match Client::connect(ConnectOptions::new(home.path(), StartDaemon::Never)).await {
        Err(e) => e,
        Ok(_) => panic!("connected without a daemon"),
    };
    assert!(matches!(e, ClientError::NotRunning { .. }), "{e}");
    assert!(e.to_string().contains("is not running"), "{e}");
}

/// The owner dies while `config.toml` is broken, so the daemon the client starts again fails:
/// the stream says why, keeps trying, and reconnects once the file is fixed (a person fixing
/// it need not restart the client).
#[tokio::test]
async fn a_restart_that_fails_says_why_and_recovers_once_the_config_is_fixed() {
    let (_model, home) = model_home(true).await.unwrap();
    let _guard = KillDaemonOnDrop(home.path());
    let (client, _, mut stream) = client_following_a_new_session(&home).await;
    let first = client.daemon();
    let config = home.path().join("config.toml");
    let good = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("{good}\nbogus = 1\n")).unwrap();
    signal(first.pid, nix::sys::signal::Signal::SIGKILL);
    let why = loop {
        let update = next_update(&mut stream).await;
        match update {
            Update::Connection(ConnectionChange::Lost { why }) if why.contains("bogus") => {
                break why
            }
            Update::Connection(ConnectionChange::Reconnected { .. }) => {
                panic!("reconnected to a daemon that cannot start")
            }
            _ => {}
        }
    };
    assert!(!why.contains("WebSocket"), "{why}");
    std::fs::write(&config, good).unwrap();
    loop {
        let update = next_update(&mut stream).await;
        if let Update::Connection(ConnectionChange::Reconnected { restarted, .. }) = update {
            assert!(restarted);
            break;
        }
    }
    assert_ne!(client.daemon().instance_id, first.instance_id);
    client.list_sessions(None, None).await.unwrap();
}

/// A daemon stopped on purpose (`drover stop`) is not started again by a client that follows
/// one of its sessions: the client says it waits, and reconnects once someone else starts a
/// daemon. A daemon that died (SIGKILL) is, as the tests above show.
#[tokio::test]
async fn a_stopped_daemon_is_waited_for_not_started_again() {
    let (_model, home) = model_home(true).await.unwrap();
    let _guard = KillDaemonOnDrop(home.path());
    let (client, _, mut stream) = client_following_a_new_session(&home).await;
    let first = client.daemon();
    let stop = run_drover(bin(), home.path(), None, &["stop"]).await;
    assert!(stop.status.success(), "{stop:?}");
    loop {
        match next_update(&mut stream).await {
            Update::Connection(ConnectionChange::Lost { why })
                if why.contains("waiting for it") =>
            {
                break
            }
            Update::Connection(ConnectionChange::Reconnected { .. }) => {
                panic!("reconnected after a stop")
            }
            _ => {}
        }
    }
    // Through several of the client's reconnect attempts (50 ms doubling to 1 s), nobody
    // starts a daemon: the home stays without one.
    let quiet = tokio::time::timeout(Duration::from_secs(3), stream.next()).await;
    assert!(
        !matches!(
            quiet,
            Ok(Some(Ok(Update::Connection(
                ConnectionChange::Reconnected { .. }
            ))))
        ),
        "{quiet:?}"
    );
    assert!(daemon_info(home.path()).is_none(), "a daemon was started");
    // Someone starts one: the client finds it.
    let other = Client::connect(options(home.path())).await.unwrap();
    loop {
        if let Update::Connection(ConnectionChange::Reconnected { restarted, .. }) =
            next_update(&mut stream).await
        {
            assert!(restarted);
            break;
        }
    }
    assert_ne!(client.daemon().instance_id, first.instance_id);
    assert_eq!(client.daemon().instance_id, other.daemon().instance_id);
}

/// A stopped daemon (SIGSTOP: its kernel still accepts connections, nothing answers) holds a
/// client no longer than its connect timeout, and the error says how long it waited.
#[tokio::test]
async fn a_frozen_daemon_is_given_up_on_at_the_connect_timeout() {
    let (_model, home) = model_home(true).await.unwrap();
    let _guard = KillDaemonOnDrop(home.path());
    drop(Client::connect(options(home.path())).await.unwrap());
    let pid = daemon_info(home.path()).expect("daemon.json")["pid"]
        .as_i64()
        .expect("pid");
    let pid = nix::unistd::Pid::from_raw(pid as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    // The signal is delivered in its own time: wait until the daemon shows as stopped.
    let stat = format!("/proc/{pid}/stat");
    let stopped = drover_test_support::wait::until(Duration::from_secs(5), async || {
        std::fs::read_to_string(&stat).is_ok_and(|s| {
            s.rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('T'))
        })
    })
    .await;
    assert!(stopped, "the daemon never stopped");
    let mut frozen = options(home.path());
    frozen.connect_timeout = Duration::from_secs(2);
    let began = std::time::Instant::now();
    let result = Client::connect(frozen).await;
    let waited = began.elapsed();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let Err(error) = result else {
        panic!("connected to a stopped daemon")
    };
    let error = error.to_string();
    assert!(error.contains("did not answer within 2 s"), "{error}");
    // One attempt used to take its own 10 s whatever the timeout.
    assert!(waited < Duration::from_secs(8), "{waited:?}: {error}");
}

/// A home removed while the client follows it is not created again by a reconnect: the stream
/// ends saying so, and no daemon runs for that path (the leak CI saw from a test whose
/// temporary home was gone when its client reconnected).
#[tokio::test]
async fn a_removed_home_is_not_started_again() {
    let (_model, home) = model_home(true).await.unwrap();
    let (client, _, mut stream) = client_following_a_new_session(&home).await;
    let first = client.daemon();
    let path = home.path().to_path_buf();
    // The home goes first, so the reconnect that follows the SIGKILL always finds it gone.
    std::fs::remove_dir_all(&path).unwrap();
    signal(first.pid, nix::sys::signal::Signal::SIGKILL);
    let end = loop {
        match tokio::time::timeout(BOUND, stream.next())
            .await
            .expect("no end")
        {
            Some(Err(e)) => break e,
            None => panic!("the stream ended without saying why"),
            Some(Ok(Update::Connection(ConnectionChange::Reconnected { .. }))) => {
                panic!("reconnected to a daemon in a removed home")
            }
            Some(Ok(_)) => {}
        }
    };
    assert!(matches!(end, ClientError::GaveUp { .. }), "{end}");
    assert!(end.to_string().contains("removed"), "{end}");
    assert!(!path.exists(), "the home was created again");
}

/// `Client::compact` (`session.compact`, SPEC section 2): the call answers once the compaction
/// turn settled, with `{status, covered}`; meanwhile the connection serves other calls; a
/// second compaction has nothing to do; a compaction whose model request fails is an error
/// naming the admission.
#[tokio::test]
async fn compact_answers_once_its_turn_settled_with_status_and_covered() {
    let (model, home) = model_home(true).await.unwrap();
    let _guard = KillDaemonOnDrop(home.path());
    let (client, id, mut stream) = client_following_a_new_session(&home).await;
    let mut stored = Vec::new();
    for text in ["one", "two", "three"] {
        let answer = format!("answer {text}");
        completed_turn(&model, &client, &mut stream, text, &answer, &mut stored).await;
    }
    let gate = Gate::new();
    model.push(
        Reply::text("A summary of turn one.")
            .usage(50, 7, 57)
            .gated(&gate),
    );
    let compacting = tokio::spawn({
        let (client, id) = (client.clone(), id.clone());
        async move { client.compact(&id).await }
    });
    // The compaction's turn runs, held in its summary request.
    let admission_id = loop {
        if let Update::Event(e) = next_update(&mut stream).await {
            if let EventPayload::TurnStarted(t) = &e.event {
                break t.admission_id.clone();
            }
        }
    };
    // The call waits for the turn, and the connection answers other calls meanwhile.
    let pong: Pong = tokio::time::timeout(BOUND, client.request(ClientRequest::Ping(NoParams {})))
        .await
        .expect("ping answered while a compaction runs")
        .unwrap();
    assert!(pong.pong);
    assert!(
        !compacting.is_finished(),
        "answered before its turn settled"
    );
    gate.open();
    let answer = tokio::time::timeout(BOUND, compacting)
        .await
        .expect("the compaction answered")
        .unwrap()
        .unwrap();
    assert_eq!(
        answer,
        CompactionResult {
            status: CompactionStatus::Compacted,
            covered: 2,
            admission_id: admission_id.clone(),
        }
    );
    let (end, _) = until_settled(&mut stream, &admission_id, &mut stored).await;
    assert_eq!(end, TurnEnd::Completed);
    let compacted: Vec<_> = stored
        .iter()
        .filter_map(|e| match &e.event {
            EventPayload::SessionCompacted(c) => Some(c.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(compacted.len(), 1, "{compacted:?}");
    assert_eq!(compacted[0].admission_id, admission_id);
    assert_eq!((compacted[0].covered, compacted[0].summary_tokens), (2, 7));
    let done = client.receipt(&id, &admission_id, true).await.unwrap();
    let result = done.result.expect("a stored result");
    assert_eq!(result.final_response, "compacted 2 messages");
    assert_eq!(result.api_calls, 1);
    assert_eq!(done.usage.expect("usage").total_tokens, 57);

    // Only the turns a compaction keeps are left: nothing to do, and the latest summary's
    // coverage is what it says.
    let again = client.compact(&id).await.unwrap();
    assert_eq!(again.status, CompactionStatus::NothingToCompact);
    assert_eq!(again.covered, 2);

    // A compaction whose summary request fails answers an error naming its admission.
    completed_turn(
        &model,
        &client,
        &mut stream,
        "four",
        "answer four",
        &mut stored,
    )
    .await;
    model.push(Reply::error(400, "the summary was refused"));
    let refused = client.compact(&id).await.unwrap_err();
    let ClientError::Rpc { error, .. } = &refused else {
        panic!("not an error answer: {refused}");
    };
    assert_eq!(error.reason(), "model_unavailable", "{error:?}");
    let detail = error.to_string();
    assert!(detail.contains("the summary was refused"), "{detail}");
    assert!(detail.contains("failed"), "{detail}");
}

/// `Client::create_and_attach`: the create's answer is the stream's snapshot (no
/// `session.resume` after it), and the stream then yields every stored event of the first
/// turn once and in order. The same `request_id` again (another client, after a turn) gives
/// the same session with its turn in the snapshot, and the next turn's events follow it.
#[tokio::test]
async fn create_and_attach_streams_the_new_session_from_its_snapshot() {
    let (model, home) = model_home(true).await.unwrap();
    let _guard = KillDaemonOnDrop(home.path());
    let client = Client::connect(options(home.path())).await.unwrap();
    let params = create(home.work());
    let mut stream = client.create_and_attach(params.clone()).await.unwrap();
    let id = stream.session_id().to_string();
    let first_seq = stream.last_seq();
    assert_eq!(stream.snapshot().session_id, id);
    let mut stored = Vec::new();
    let a = completed_turn(
        &model,
        &client,
        &mut stream,
        "one",
        "first answer",
        &mut stored,
    )
    .await;
    let seqs: Vec<u64> = stored.iter().filter_map(|e| e.seq).collect();
    let expected: Vec<u64> = (first_seq + 1..=first_seq + seqs.len() as u64).collect();
    assert_eq!(
        seqs, expected,
        "every stored event once, in order, after the snapshot"
    );
    assert!(stored
        .iter()
        .any(|e| matches!(&e.event, EventPayload::TurnStarted(t) if t.admission_id == a)));

    let other = Client::connect(options(home.path())).await.unwrap();
    let mut again = other.create_and_attach(params).await.unwrap();
    assert_eq!(
        again.session_id(),
        id,
        "the same request_id is the same session"
    );
    assert!(
        again.last_seq() >= stream.last_seq(),
        "its snapshot holds the first turn"
    );
    let snapshot_seq = again.last_seq();
    let mut more = Vec::new();
    completed_turn(
        &model,
        &other,
        &mut again,
        "two",
        "second answer",
        &mut more,
    )
    .await;
    let seqs: Vec<u64> = more.iter().filter_map(|e| e.seq).collect();
    assert_eq!(seqs.first().copied(), Some(snapshot_seq + 1));
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
}

/// The `drover daemon` processes of `home`: by their title (`drover daemon <home>`), or, before
/// they set it, by a command line naming `daemon` and `home`.
fn daemons_of(home: &Path) -> Vec<u32> {
    let home = home.display().to_string();
    let title = format!("drover daemon {home}");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            (args.iter().any(|a| a == "daemon") && args.contains(&home))
                || drover_test_support::harness::process_title(*pid) == title
        })
        .collect()
}

/// Four `drover run` started at once on a home without a daemon: the ones that start a daemon
/// while another is starting see that one find the home taken and exit 3; every run is
/// answered by the daemon that won, and no other daemon is left behind.
#[tokio::test]
async fn clients_starting_the_daemon_at_once_share_the_one_that_won() {
    let (model, home) = model_home(true).await.unwrap();
    let _guard = KillDaemonOnDrop(home.path());
    for _ in 0..4 {
        model.push(Reply::text("shared answer"));
    }
    let runs = (0..4).map(|_| run_drover(bin(), home.path(), Some(home.work()), &["run", "hi"]));
    for out in futures::future::join_all(runs).await {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "shared answer");
    }
    let info = daemon_info(home.path()).expect("daemon.json");
    let pid = info["pid"].as_u64().unwrap() as u32;
    assert!(
        drover_test_support::wait::until(BOUND, async || daemons_of(home.path()) == vec![pid])
            .await,
        "daemons left: {:?}, daemon.json names {pid}",
        daemons_of(home.path())
    );
}

/// A daemon that holds its home while its `daemon.json` is gone (removed by hand; the daemon
/// writes it again within a second): a first connection starts a daemon without reading who
/// holds the lock (that read costs a cold start 8-12 ms); the one it starts finds the
/// home taken and exits, and from then on the client waits for the holder, never starting
/// daemons in a loop, and connects to it once its file is back.
#[tokio::test]
async fn a_daemon_whose_file_is_gone_is_waited_for_not_started_again_and_again() {
    let (_model, home) = model_home(true).await.unwrap();
    let _guard = KillDaemonOnDrop(home.path());
    let first = Client::connect(options(home.path())).await.unwrap();
    let holder = first.daemon().pid;
    drop(first);
    std::fs::remove_file(home.path().join("daemon.json")).unwrap();

    let connecting = tokio::spawn(Client::connect(options(home.path())));
    // Past the first start (that daemon exits within milliseconds), a second daemon process
    // of this home is a start again: watch for one until the client is through.
    let mut crowded = Vec::new();
    let started = std::time::Instant::now();
    while !connecting.is_finished() && started.elapsed() < BOUND {
        let now = daemons_of(home.path());
        if started.elapsed() > Duration::from_millis(300) && now.len() > 1 {
            crowded.push(now);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let client = connecting
        .await
        .unwrap()
        .expect("connects once daemon.json is back");
    assert_eq!(
        client.daemon().pid,
        holder,
        "connected to the daemon that held the home"
    );
    assert!(crowded.is_empty(), "daemons started again: {crowded:?}");
    assert_eq!(daemons_of(home.path()), vec![holder]);
}

/// A stored event that no longer parses (a payload that is not JSON, or no longer its type's
/// shape) and one of a type this version does not know (written by a newer daemon) do not
/// fail `session.events.since`: the page comes back whole, in `seq` order, the damaged ones as
/// `event.unreadable` and the unknown one as it was stored, which the typed client keeps as
/// `EventPayload::Other`.
#[tokio::test]
async fn events_that_do_not_parse_or_are_of_an_unknown_type_do_not_fail_events_since() {
    use drover_protocol::event::{OtherEvent, EVENT_UNREADABLE};
    let (_model, home) = model_home(true).await.unwrap();
    let _guard = KillDaemonOnDrop(home.path());
    let client = Client::connect(options(home.path())).await.unwrap();
    let session = client.create_session(create(home.work())).await.unwrap();
    let sid = session.session_id.clone();
    let db = home.db();
    let (epoch, last) = {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.busy_timeout(BOUND).unwrap();
        let epoch: String = conn
            .query_row(
                "SELECT replay_epoch FROM sessions WHERE id = ?1",
                [&sid],
                |r| r.get(0),
            )
            .unwrap();
        let last: i64 = conn
            .query_row(
                "SELECT COALESCE(MAX(seq), 0) FROM session_events WHERE session_id = ?1",
                [&sid],
                |r| r.get(0),
            )
            .unwrap();
        let rows = [
            ("turn.rewound", r#"{"to":1}"#),
            ("tool.start", "{not json"),
            ("tool.start", r#"{"tool_id":12}"#),
            (
                "turn.started",
                r#"{"admission_id":"a-1","execution_generation":1}"#,
            ),
        ];
        for (i, (kind, payload)) in rows.iter().enumerate() {
            conn.execute(
                "INSERT INTO session_events (session_id, seq, type, payload_json, created_at)
                 VALUES (?1, ?2, ?3, ?4, 0)",
                rusqlite::params![sid, last + 1 + i as i64, kind, payload],
            )
            .unwrap();
        }
        (epoch, last as u64)
    };
    let page = client
        .events_since(&sid, Some(&epoch), last, None)
        .await
        .expect("the page reads past the damaged and unknown events");
    assert!(!page.snapshot_required);
    let seqs: Vec<_> = page.events.iter().map(|e| e.seq).collect();
    assert_eq!(
        seqs,
        (last + 1..=last + 4).map(Some).collect::<Vec<_>>(),
        "{page:?}"
    );
    assert_eq!(
        page.events[0].event,
        EventPayload::Other(OtherEvent {
            kind: "turn.rewound".into(),
            payload: serde_json::json!({"to": 1}),
        })
    );
    for damaged in &page.events[1..3] {
        let EventPayload::EventUnreadable(unreadable) = &damaged.event else {
            panic!("{damaged:?}");
        };
        assert_eq!(damaged.event.kind(), EVENT_UNREADABLE);
        assert_eq!(unreadable.kind, "tool.start", "{damaged:?}");
    }
    assert!(matches!(page.events[3].event, EventPayload::TurnStarted(_)));
}
