//! Every wire type serialises and parses back to the same value, and one example of each is
//! pinned to its exact JSON bytes: a change to a field name, its order, a default or a skipped
//! `None` changes what the other process reads, so it must show up here first.
//!
//! Objects inside free-form `Value` fields are written with their keys sorted, which is how
//! `serde_json` writes a map whether or not another crate turns on `preserve_order`.

// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::fmt::Debug;

use drover_protocol::event::{self, Event};
use drover_protocol::rpc::{Notification, Request, Response};
use drover_protocol::worker::read_head;
use drover_protocol::worker::{
    BackgroundProcess, BodyFrame, BodyPiece, Bootstrap, BootstrapFrameError, BootstrapHead,
    ChildReserve, ExecutionFinish, JobRegister, JobsWire, McpServerSpec, Operation, OwnerFrame,
    PersistFrame, Policy, ProcessStatus, ProcessUpdate, PromptOpen, TranscriptAppend, TurnOutcome,
    UsageAdd, WorkerFrame, BOOTSTRAP_PART_BYTES, MAX_FRAME_BYTES,
};
use drover_protocol::ModelSettings;
use drover_protocol::{ChatMessage, ErrorReason, FunctionCall, Role, RpcError, ToolCall, Usage};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

/// `value` serialises to text that parses back to `value`; gives the text.
fn round_trip<T>(value: &T) -> String
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    let text = serde_json::to_string(value).expect("serialises");
    let back: T = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
    assert_eq!(&back, value, "{text}");
    text
}

/// `text` parses as a `T` that serialises to exactly `text` (and round-trips); gives the value.
fn pinned<T>(text: &str) -> T
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    let value: T = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    assert_eq!(round_trip(&value), text, "the bytes on the wire changed");
    value
}

/// For the envelope types, which have no `PartialEq`: the text of `value` parses and
/// serialises to the same text; gives it.
fn round_trip_text<T: Serialize + DeserializeOwned>(value: &T) -> String {
    let text = serde_json::to_string(value).expect("serialises");
    let back: T = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
    assert_eq!(serde_json::to_string(&back).expect("serialises"), text);
    text
}

/// [`pinned`] for the envelope types.
fn pinned_text<T: Serialize + DeserializeOwned>(text: &str) -> T {
    let value: T = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    assert_eq!(
        round_trip_text(&value),
        text,
        "the bytes on the wire changed"
    );
    value
}

// ---------------------------------------------------------------------------------------------
// The client envelope (SPEC section 2)

#[test]
fn a_request_round_trips_with_and_without_an_id() {
    let request: Request = pinned_text(concat!(
        r#"{"jsonrpc":"2.0","id":7,"method":"prompt.submit","#,
        r#""params":{"input_id":"in-1","session_id":"s-1","text":"héllo ✓"}}"#
    ));
    assert_eq!(request.id, Some(json!(7)));
    assert_eq!(request.method, "prompt.submit");
    assert_eq!(request.params["text"], "héllo ✓");

    // A notification has no id, and no `id` key is written for it.
    let notification: Request =
        pinned_text(r#"{"jsonrpc":"2.0","method":"session.detach","params":{"session_id":"s"}}"#);
    assert_eq!(notification.id, None);
    // A string id is kept as a string; absent params parse as null.
    let bare: Request = serde_json::from_str(r#"{"id":"a","method":"ping"}"#).unwrap();
    assert_eq!(
        (bare.id, bare.jsonrpc, bare.params),
        (Some(json!("a")), None, Value::Null)
    );
}

#[test]
fn responses_round_trip_with_exactly_one_of_result_and_error() {
    let ok = Response::ok(json!(1), json!({"pong": true}));
    assert_eq!(
        round_trip_text(&ok),
        r#"{"jsonrpc":"2.0","id":1,"result":{"pong":true}}"#
    );
    let err = Response::err(
        json!("req-2"),
        RpcError::invalid_field("text", "text must not be empty"),
    );
    // The keys of `data` (a JSON object) may come in either order: a build with serde_json's
    // `preserve_order` (the ACP SDK turns it on) writes them as they were inserted.
    let text = round_trip_text(&err);
    assert!(
        text.starts_with(r#"{"jsonrpc":"2.0","id":"req-2","error":{"code":-32602,"#),
        "{text}"
    );
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap(),
        json!({"jsonrpc": "2.0", "id": "req-2", "error": {"code": -32602, "message": "invalid_params",
            "data": {"detail": "text must not be empty", "field": "text", "reason": "invalid_params"}}})
    );
    let back: Response = serde_json::from_str(&text).unwrap();
    assert!(back.result.is_none());
    assert_eq!(
        back.error.as_ref().map(RpcError::reason),
        Some("invalid_params")
    );
}

#[test]
fn rpc_errors_round_trip_for_every_reason() {
    for reason in ErrorReason::ALL {
        let word = round_trip(&reason);
        assert_eq!(word, format!("\"{}\"", reason.as_str()));
        assert_eq!(ErrorReason::parse(reason.as_str()), Some(reason));
        let error = RpcError::new(reason, "why");
        round_trip(&error);
        assert_eq!(
            (error.code, error.reason()),
            (reason.code(), reason.as_str())
        );
    }
    let error: RpcError = pinned(
        r#"{"code":4001,"message":"stale_epoch","data":{"detail":"epoch 3 is current","reason":"stale_epoch"}}"#,
    );
    assert_eq!(
        error,
        RpcError::new(ErrorReason::StaleEpoch, "epoch 3 is current")
    );
    // `data` may be missing on the wire; it reads as null.
    let bare: RpcError =
        serde_json::from_str(r#"{"code":-32601,"message":"unknown_method"}"#).unwrap();
    assert_eq!(
        (&bare.data, bare.reason()),
        (&Value::Null, "unknown_method")
    );
}

// ---------------------------------------------------------------------------------------------
// Events (SPEC section 2, "Events")

#[test]
fn events_round_trip_stored_and_live() {
    let stored: Event = pinned(concat!(
        r#"{"session_id":"s-1","seq":12,"replay_epoch":"e-9","type":"turn.settled","#,
        r#""payload":{"admission_id":"a-1","outcome":"completed"}}"#
    ));
    assert_eq!(
        (stored.kind.as_str(), stored.seq),
        (event::TURN_SETTLED, Some(12))
    );

    // A delta is live only: `seq` is null, and a missing `seq` reads the same.
    let delta: Event = pinned(
        r#"{"session_id":"s-1","seq":null,"replay_epoch":"e-9","type":"message.delta","payload":{"delta_index":0,"text":"Hi"}}"#,
    );
    assert_eq!(delta.kind, event::MESSAGE_DELTA);
    let no_seq: Event = serde_json::from_str(
        r#"{"session_id":"s-1","replay_epoch":"e-9","type":"message.delta","payload":{"delta_index":0,"text":"Hi"}}"#,
    )
    .unwrap();
    assert_eq!(no_seq, delta);

    // As the params of the `event` notification.
    let note = Notification::new("event", serde_json::to_value(&stored).unwrap());
    let text = round_trip_text(&note);
    assert!(
        text.starts_with(r#"{"jsonrpc":"2.0","method":"event","params":{"#),
        "{text}"
    );
    let back: Notification = serde_json::from_str(&text).unwrap();
    assert_eq!(
        serde_json::from_value::<Event>(back.params).unwrap(),
        stored
    );
}

#[test]
fn turn_progress_is_live_and_names_its_tool_only_when_one_is_open() {
    use drover_protocol::event::{EventPayload, SessionEvent, TurnPhase, TurnProgress};
    let tool: SessionEvent = pinned(concat!(
        r#"{"session_id":"s-1","seq":null,"replay_epoch":"e-9","type":"turn.progress","#,
        r#""payload":{"admission_id":"a-1","phase":"tool","tool_id":"call_1","elapsed_ms":5004}}"#
    ));
    assert_eq!(
        tool.event,
        EventPayload::TurnProgress(TurnProgress {
            admission_id: "a-1".into(),
            phase: TurnPhase::Tool,
            tool_id: Some("call_1".into()),
            elapsed_ms: 5004,
        })
    );
    assert_eq!(tool.event.kind(), event::TURN_PROGRESS);
    assert!(tool.event.is_live_only());
    let model: SessionEvent = pinned(concat!(
        r#"{"session_id":"s-1","seq":null,"replay_epoch":"e-9","type":"turn.progress","#,
        r#""payload":{"admission_id":"a-1","phase":"model_request","elapsed_ms":0}}"#
    ));
    assert!(matches!(
        model.event,
        EventPayload::TurnProgress(TurnProgress { tool_id: None, .. })
    ));
    for phase in ["model_request", "tool", "prompt_wait"] {
        let p: TurnPhase = serde_json::from_value(json!(phase)).unwrap();
        assert_eq!(serde_json::to_value(p).unwrap(), json!(phase));
    }
    assert!(serde_json::from_value::<TurnPhase>(json!("thinking")).is_err());
}

#[test]
fn an_event_of_an_unknown_type_or_an_unreadable_payload_is_kept_as_other() {
    use drover_protocol::event::{EventPayload, OtherEvent, SessionEvent};
    // A newer daemon's type: kept as sent, and written back the same.
    let newer: SessionEvent = pinned(concat!(
        r#"{"session_id":"s-1","seq":7,"replay_epoch":"e-9","type":"turn.rewound","#,
        r#""payload":{"to":3}}"#
    ));
    assert_eq!(
        newer.event,
        EventPayload::Other(OtherEvent {
            kind: "turn.rewound".into(),
            payload: json!({"to": 3}),
        })
    );
    assert_eq!(newer.event.kind(), "turn.rewound");
    // A page holding one: the rest of the page still reads.
    let page: drover_protocol::client::EventsPage = serde_json::from_value(json!({
        "events": [
            {"session_id": "s-1", "seq": 7, "replay_epoch": "e-9", "type": "turn.rewound",
             "payload": {"to": 3}},
            {"session_id": "s-1", "seq": 8, "replay_epoch": "e-9", "type": "turn.started",
             "payload": {"admission_id": "a-1", "execution_generation": 1}},
        ],
        "last_sequence": 8, "replay_epoch": "e-9", "snapshot_required": false, "has_more": false
    }))
    .unwrap();
    assert_eq!(page.events.len(), 2);
    assert!(matches!(page.events[1].event, EventPayload::TurnStarted(_)));
    // A stored event of a known type that no longer parses becomes `event.unreadable`, with
    // its seq, its type and its payload.
    let stored = Event {
        session_id: "s-1".into(),
        seq: Some(4),
        replay_epoch: "e-9".into(),
        kind: event::TOOL_START.into(),
        payload: json!({"tool_id": 12}),
    };
    let typed = stored.into_typed();
    assert_eq!(typed.seq, Some(4));
    let EventPayload::EventUnreadable(unreadable) = &typed.event else {
        panic!("{typed:?}");
    };
    assert_eq!(typed.event.kind(), event::EVENT_UNREADABLE);
    assert_eq!(unreadable.kind, "tool.start");
    assert_eq!(unreadable.payload, Some(json!({"tool_id": 12})));
    let text = serde_json::to_string(&typed).unwrap();
    assert_eq!(serde_json::from_str::<SessionEvent>(&text).unwrap(), typed);
    // One that parses stays typed.
    let good = Event {
        session_id: "s-1".into(),
        seq: Some(5),
        replay_epoch: "e-9".into(),
        kind: event::TURN_STARTED.into(),
        payload: json!({"admission_id": "a-1", "execution_generation": 2}),
    };
    assert!(matches!(
        good.into_typed().event,
        EventPayload::TurnStarted(_)
    ));
}

// ---------------------------------------------------------------------------------------------
// Chat messages

#[test]
fn chat_messages_round_trip_in_every_role() {
    for role in [Role::System, Role::User, Role::Assistant, Role::Tool] {
        assert_eq!(round_trip(&role), format!("\"{}\"", role.as_str()));
        assert_eq!(Role::parse(role.as_str()), Some(role));
        round_trip(&ChatMessage::text(
            role,
            "text with \"quotes\", a tab\t and ünïcode",
        ));
    }
    let result = ChatMessage::tool_result("call_1", "terminal", "");
    assert_eq!(
        round_trip(&result),
        r#"{"role":"tool","content":"","tool_call_id":"call_1","tool_name":"terminal"}"#
    );

    let call: ChatMessage = pinned(concat!(
        r#"{"role":"assistant","tool_calls":[{"id":"call_1","type":"function","#,
        r#""function":{"name":"terminal","arguments":"{\"command\": \"ls -la\"}"}}]}"#
    ));
    assert_eq!(call.content, None);
    assert_eq!(
        call.tool_calls,
        [ToolCall {
            id: "call_1".into(),
            kind: "function".into(),
            function: FunctionCall {
                name: "terminal".into(),
                // The model's arguments are kept verbatim, spacing included.
                arguments: r#"{"command": "ls -la"}"#.into(),
            },
        }]
    );
    // `type` defaults to `function`.
    let untyped: ToolCall =
        serde_json::from_str(r#"{"id":"c","function":{"name":"n","arguments":"{}"}}"#).unwrap();
    assert_eq!(untyped.kind, "function");
}

#[test]
fn usage_round_trips_up_to_the_largest_count() {
    let usage: Usage = pinned(r#"{"input_tokens":10,"output_tokens":5,"total_tokens":15}"#);
    assert_eq!(usage.total_tokens, 15);
    let max = drover_protocol::TOKEN_COUNT_MAX;
    round_trip(&Usage {
        input_tokens: max,
        output_tokens: 0,
        total_tokens: max,
    });
}

// ---------------------------------------------------------------------------------------------
// Owner -> worker frames (SPEC section 4)

const POLICY: &str = concat!(
    r#"{"model":"gpt-test","base_url":"http://127.0.0.1:9/v1","api_key":null,"stream":true,"#,
    r#""request_timeout_s":600,"max_retries":3,"stall_timeout_s":120,"api":"chat","#,
    r#""connect_timeout_s":10,"first_byte_timeout_s":60,"#,
    r#""system_prompt":"You are drover.","#,
    r#""toolsets":["terminal","jobs"],"#,
    r#""tools":[{"function":{"name":"terminal","parameters":{"type":"object"}},"type":"function"}],"#,
    r#""cwd":"/work","max_steps":50,"approvals":"manual","home":"/home/u/.drover","#,
    r#""approval_grants":["rm -r"],"#,
    r#""background_processes":[{"id":"proc_1","pid":4242,"start_time":123456,"command":"sleep 30","#,
    r#""cwd":"/work","log_path":"/home/u/.drover/logs/proc_1.log","status":"running","#,
    r#""exit_code":null,"started_at":1700000000.5}],"#,
    r#""mcp_servers":{"echo":{"command":"drover-mcp-echo","args":["--quiet"],"env":{"A":"1"},"#,
    r#""tool_timeout_s":30}},"#,
    r#""jobs_wire":{"url":"mqtt://127.0.0.1:1883","username_env":null,"password_env":null,"#,
    r#""topic_base":"drover/v1"},"#,
    r#""sandbox":{"mode":"workspace-write","writable_roots":["/work"],"network":false,"#,
    r#""hidden":["/home/u/.drover"],"required":true,"#,
    r#""support":{"namespaces":true,"landlock_abi":7,"problems":[]},"#,
    r#""env":{"keep":["GH_TOKEN"],"set":{"LANG":"C.UTF-8"}}},"#,
    r#""context":{"context_window":64000,"compact_at":0.75,"keep_recent_turns":1}}"#
);

/// A bootstrap head frame carrying [`POLICY`] and one body part.
fn head_with_policy() -> String {
    format!(
        concat!(
            r#"{{"type":"bootstrap","scope":{{"session_id":"s-1","admission_id":"a-1","#,
            r#""execution_id":"x-1","generation":2,"epoch":5,"secret":"0123abcd"}},"#,
            r#""policy":{},"body_parts":1}}"#
        ),
        POLICY
    )
}

#[test]
fn a_bootstrap_head_and_part_round_trip_with_the_whole_policy() {
    let text = head_with_policy();
    let frame: OwnerFrame = pinned(&text);
    let OwnerFrame::Bootstrap(head) = frame else {
        panic!("not a bootstrap: {frame:?}")
    };
    assert_eq!(head.scope.generation, 2);
    assert_eq!(
        head.policy.background_processes[0].status,
        ProcessStatus::Running
    );
    assert_eq!(head.policy.mcp_servers["echo"].args, ["--quiet"]);
    assert_eq!(head.policy.mcp_servers["echo"].tool_timeout_s, 30);
    assert_eq!(head.policy.model_settings.stall_timeout_s, 120);
    assert_eq!(
        head.policy.sandbox.mode,
        drover_protocol::sandbox::SandboxMode::WorkspaceWrite
    );
    assert_eq!(head.policy.sandbox.support.landlock_abi, Some(7));
    assert_eq!(head.policy.context.context_window, 64000);
    assert_eq!(head.policy.context.keep_recent_turns, 1);
    let part: OwnerFrame = pinned(concat!(
        r#"{"type":"bootstrap_part","text":"{\"history\":[{\"role\":\"user\","#,
        r#"\"content\":\"earlier\"}],\"history_ids\":[7],\"input\":\"now this\"}"}"#
    ));
    let OwnerFrame::BootstrapPart { text } = part else {
        panic!("not a part: {part:?}")
    };
    let bootstrap = Bootstrap::assemble(*head.clone(), std::slice::from_ref(&text)).unwrap();
    assert_eq!(
        bootstrap.history,
        [ChatMessage::text(Role::User, "earlier")]
    );
    assert_eq!(bootstrap.input, "now this");
    // Cut into frames again, the body fits in one frame: the head, then the body whole as
    // a JSON object (not escaped into a string).
    let frames = bootstrap.clone().into_frames().unwrap();
    assert_eq!(frames.len(), 2);
    assert_eq!(frames[0], OwnerFrame::Bootstrap(head.clone()));
    let line = serde_json::to_string(&frames[1]).unwrap();
    assert_eq!(
        line,
        format!(r#"{{"type":"bootstrap_body","body":{text}}}"#)
    );
    // The worker reads it in one typed pass; the tagged frame reads the same.
    let BodyPiece::Whole(body) = serde_json::from_str::<BodyFrame>(&line)
        .unwrap()
        .piece()
        .unwrap()
    else {
        panic!("not a whole body")
    };
    assert_eq!(
        Bootstrap::from_head_and_body(*head.clone(), body),
        bootstrap
    );
    assert_eq!(
        serde_json::from_str::<OwnerFrame>(&line).unwrap(),
        frames[1]
    );
    // A part's text reads as a piece of text; anything else is named.
    let BodyPiece::Text(piece) = serde_json::from_str::<BodyFrame>(
        &serde_json::to_string(&OwnerFrame::BootstrapPart { text: text.clone() }).unwrap(),
    )
    .unwrap()
    .piece()
    .unwrap() else {
        panic!("not text")
    };
    assert_eq!(piece, text);
    for (frame, reason) in [
        (
            r#"{"type":"receipt","sequence":1,"result":{}}"#,
            r#"type "receipt""#,
        ),
        (
            r#"{"type":"bootstrap_body","text":"{}"}"#,
            "needs `body` only",
        ),
        (r#"{"type":"bootstrap_part"}"#, "needs `text` only"),
    ] {
        let err = serde_json::from_str::<BodyFrame>(frame)
            .unwrap()
            .piece()
            .unwrap_err();
        assert!(err.contains(reason), "{frame}: {err}");
    }
    // A part missing, or one too many, is refused.
    assert!(Bootstrap::assemble(*head.clone(), &[]).is_err());
    assert!(Bootstrap::assemble(*head.clone(), &[text.clone(), text]).is_err());
    round_trip::<Bootstrap>(&bootstrap);
    assert!(!bootstrap.compact_only);
    // A compaction-only turn (`session.compact`): the flag travels in the body, only when set.
    let mut compact = bootstrap;
    compact.input.clear();
    compact.compact_only = true;
    let frames = compact.clone().into_frames().unwrap();
    let OwnerFrame::BootstrapBody { body } = &frames[1] else {
        panic!("not a body: {:?}", frames[1])
    };
    let text = body.0.get().to_string();
    assert_eq!(
        text,
        r#"{"history":[{"role":"user","content":"earlier"}],"history_ids":[7],"input":"","compact_only":true}"#
    );
    assert_eq!(
        Bootstrap::assemble(*head, std::slice::from_ref(&text)).unwrap(),
        compact
    );
}

#[test]
fn the_worker_reads_a_head_as_the_tagged_frame_reads_it() {
    let text = head_with_policy();
    let OwnerFrame::Bootstrap(tagged) = pinned::<OwnerFrame>(&text) else {
        panic!("not a bootstrap")
    };
    let head = read_head(text.as_bytes()).expect("the head");
    assert_eq!(head, *tagged);
    // The `type` is checked first and named when it is another one.
    let err = read_head(br#"{"type":"receipt","sequence":1,"result":{}}"#).unwrap_err();
    assert!(err.contains("\"receipt\""), "{err}");
    assert!(read_head(br#"{"scope":{}}"#).is_err());
    assert!(read_head(b"not json").is_err());
    // A head without the model settings reads their defaults, as the tagged frame does.
    let mut bare: Value = serde_json::from_str(&text).unwrap();
    for key in [
        "stream",
        "request_timeout_s",
        "max_retries",
        "stall_timeout_s",
    ] {
        bare["policy"].as_object_mut().unwrap().remove(key);
    }
    let bare = serde_json::to_vec(&bare).unwrap();
    let head = read_head(&bare).expect("a bare head");
    assert_eq!(head.policy.model_settings, ModelSettings::default());
    // The owner's lines are the frames, each serialized once, a newline after each.
    let bootstrap = Bootstrap::from_head_and_body(
        head,
        serde_json::from_str(r#"{"history":[],"history_ids":[],"input":"hi"}"#).unwrap(),
    );
    let lines = bootstrap.clone().into_lines().expect("lines");
    let frames = bootstrap.into_frames().expect("frames");
    assert_eq!(lines.len(), frames.len());
    for (line, frame) in lines.iter().zip(&frames) {
        let mut expected = serde_json::to_vec(frame).unwrap();
        expected.push(b'\n');
        assert_eq!(line, &expected);
    }
    assert!(read_head(&lines[0]).is_ok());
}

#[test]
fn a_history_of_any_size_travels_in_bounded_frames() {
    let base = Bootstrap::assemble(
        serde_json::from_str::<BootstrapHead>(&format!(
            concat!(
                r#"{{"scope":{{"session_id":"s","admission_id":"a","execution_id":"x","#,
                r#""generation":1,"epoch":1,"secret":"k"}},"policy":{},"body_parts":1}}"#
            ),
            POLICY
        ))
        .unwrap(),
        &[r#"{"history":[],"input":""}"#.to_string()],
    )
    .unwrap();
    // One message alone over the frame limit, made of what escaping makes longest (quotes and
    // backslashes) and of multi-byte characters that a cut must not split, then many more.
    let mut history = vec![ChatMessage::text(
        Role::Tool,
        "\"\\é\u{1F600}\n\u{1}".repeat(MAX_FRAME_BYTES / 4),
    )];
    for i in 0..2000 {
        history.push(ChatMessage::text(
            Role::User,
            format!("message {i} ").repeat(300),
        ));
    }
    let mut bootstrap = base.clone();
    bootstrap.history = history;
    bootstrap.input = "\u{2}".repeat(MAX_FRAME_BYTES / 2);
    let frames = bootstrap.clone().into_frames().unwrap();
    assert!(frames.len() > 10, "{} frames", frames.len());
    let mut parts = Vec::new();
    let mut frames = frames.into_iter();
    let Some(OwnerFrame::Bootstrap(head)) = frames.next() else {
        panic!("the head comes first")
    };
    for frame in frames {
        let line = serde_json::to_vec(&frame).unwrap();
        assert!(
            line.len() <= MAX_FRAME_BYTES,
            "a frame of {} bytes",
            line.len()
        );
        let OwnerFrame::BootstrapPart { text } = frame else {
            panic!("only parts follow the head")
        };
        assert!(text.len() <= BOOTSTRAP_PART_BYTES);
        parts.push(text);
    }
    assert_eq!(head.body_parts, parts.len() as u64);
    assert_eq!(Bootstrap::assemble(*head, &parts).unwrap(), bootstrap);

    // An empty history and input still take one part.
    let frames = base.clone().into_frames().unwrap();
    assert_eq!(frames.len(), 2);

    // A body whose frame is exactly the limit goes whole; one byte more goes in text parts.
    let body_line = |input: usize| {
        let mut b = base.clone();
        b.input = "x".repeat(input);
        b.into_frames().unwrap()
    };
    let empty = serde_json::to_vec(&body_line(0)[1]).unwrap().len();
    let exact = body_line(MAX_FRAME_BYTES - empty);
    assert_eq!(exact.len(), 2);
    assert!(matches!(exact[1], OwnerFrame::BootstrapBody { .. }));
    assert_eq!(
        serde_json::to_vec(&exact[1]).unwrap().len(),
        MAX_FRAME_BYTES
    );
    let over = body_line(MAX_FRAME_BYTES - empty + 1);
    assert!(over.len() > 2);
    for frame in &over[1..] {
        assert!(
            matches!(frame, OwnerFrame::BootstrapPart { .. }),
            "{frame:?}"
        );
        assert!(serde_json::to_vec(frame).unwrap().len() <= MAX_FRAME_BYTES);
    }

    // A head over the limit is refused by name.
    let mut huge = bootstrap;
    huge.policy.system_prompt = "x".repeat(MAX_FRAME_BYTES);
    let err = huge.into_frames().unwrap_err();
    assert!(matches!(err, BootstrapFrameError::HeadTooLong(_)), "{err}");
}

#[test]
fn a_policy_without_its_optional_fields_reads_the_defaults() {
    let policy: Policy = serde_json::from_str(concat!(
        r#"{"model":"m","base_url":"http://127.0.0.1:9/v1","stream":false,"#,
        r#""request_timeout_s":1,"max_retries":0,"system_prompt":"","toolsets":[],"tools":[],"#,
        r#""cwd":"/","max_steps":1,"home":"/h"}"#
    ))
    .unwrap();
    assert_eq!(policy.api_key, None);
    assert_eq!(
        serde_json::to_value(&policy).unwrap()["approvals"],
        "manual"
    );
    assert!(policy.approval_grants.is_empty() && policy.background_processes.is_empty());
    assert!(policy.mcp_servers.is_empty());
    assert_eq!(policy.jobs_wire, JobsWire::default());
    assert_eq!(policy.sandbox, Default::default());
    round_trip(&policy);
}

#[test]
fn receipt_refused_and_stop_frames_round_trip() {
    let receipt: OwnerFrame =
        pinned(r#"{"type":"receipt","sequence":3,"result":{"message_ids":[7,8]}}"#);
    assert_eq!(
        receipt,
        OwnerFrame::Receipt {
            sequence: 3,
            result: json!({"message_ids": [7, 8]}),
        }
    );
    let refused: OwnerFrame = pinned(
        r#"{"type":"refused","sequence":4,"reason":"stale_generation","message":"generation 3 is current"}"#,
    );
    assert!(matches!(refused, OwnerFrame::Refused { sequence: 4, .. }));
    let stop: OwnerFrame = pinned(r#"{"type":"stop","reason":"interrupt"}"#);
    assert_eq!(
        stop,
        OwnerFrame::Stop {
            reason: "interrupt".into()
        }
    );
    let approvals: OwnerFrame = pinned(r#"{"type":"approvals","mode":"auto"}"#);
    assert_eq!(
        approvals,
        OwnerFrame::Approvals {
            mode: drover_protocol::ApprovalMode::Auto
        }
    );
}

// ---------------------------------------------------------------------------------------------
// Worker -> owner frames and persist payloads (SPEC section 4)

#[test]
fn persist_and_delta_frames_round_trip() {
    let persist: WorkerFrame = pinned(concat!(
        r#"{"type":"persist","epoch":5,"execution_id":"x-1","generation":2,"sequence":1,"#,
        r#""operation":"usage.add","payload":{"input_tokens":10,"output_tokens":5,"total_tokens":15,"api_calls":1},"#,
        r#""secret":"0123abcd"}"#
    ));
    let WorkerFrame::Persist(PersistFrame {
        operation: Operation::UsageAdd(usage),
        ..
    }) = &persist
    else {
        panic!("not a usage.add persist: {persist:?}")
    };
    assert_eq!((usage.api_calls, usage.total_tokens), (1, 15));

    let delta: WorkerFrame = pinned(r#"{"type":"delta","text":"Hel"}"#);
    assert_eq!(delta, WorkerFrame::Delta { text: "Hel".into() });
    // A frame of another type is refused, not read as something else.
    assert!(serde_json::from_str::<WorkerFrame>(r#"{"type":"bootstrap","text":"x"}"#).is_err());
    assert!(serde_json::from_str::<OwnerFrame>(r#"{"type":"delta","text":"x"}"#).is_err());
}

#[test]
fn transcript_append_round_trips_and_skips_empty_maps() {
    let append: TranscriptAppend = pinned(concat!(
        r#"{"messages":[{"role":"assistant","content":"running it","tool_calls":[{"id":"c1","#,
        r#""type":"function","function":{"name":"terminal","arguments":"{}"}}]},"#,
        r#"{"role":"tool","content":"exit 1","tool_call_id":"c1","tool_name":"terminal"}],"#,
        r#""tool_contexts":{"c1":"ls"},"tool_errors":["c1"]}"#
    ));
    assert_eq!(append.tool_contexts["c1"], "ls");
    let plain = TranscriptAppend {
        messages: vec![ChatMessage::text(Role::Assistant, "done")],
        tool_contexts: BTreeMap::new(),
        tool_errors: Vec::new(),
    };
    assert_eq!(
        round_trip(&plain),
        r#"{"messages":[{"role":"assistant","content":"done"}]}"#
    );
}

#[test]
fn usage_add_round_trips() {
    let usage: UsageAdd =
        pinned(r#"{"input_tokens":1,"output_tokens":2,"total_tokens":3,"api_calls":1}"#);
    assert_eq!(usage.output_tokens, 2);
    round_trip(&UsageAdd::default());
}

#[test]
fn execution_finish_round_trips_for_every_outcome() {
    for outcome in [
        TurnOutcome::Completed,
        TurnOutcome::Failed,
        TurnOutcome::Interrupted,
    ] {
        assert_eq!(round_trip(&outcome), format!("\"{}\"", outcome.as_str()));
    }
    let finish: ExecutionFinish = pinned(concat!(
        r#"{"outcome":"failed","result":{"final_response":"","model":"gpt-test","api_calls":2},"#,
        r#""error":"model_unavailable: 503","usage":{"input_tokens":4,"output_tokens":0,"total_tokens":4}}"#
    ));
    assert_eq!(finish.outcome, TurnOutcome::Failed);
    // `error` is skipped when absent; `usage` defaults to zero.
    let completed: ExecutionFinish = serde_json::from_str(
        r#"{"outcome":"completed","result":{"final_response":"hi","model":"m","api_calls":1}}"#,
    )
    .unwrap();
    assert_eq!(
        (completed.error.as_deref(), completed.usage),
        (None, Usage::default())
    );
    assert!(!round_trip(&completed).contains("\"error\""));
}

#[test]
fn child_reserve_and_prompt_open_round_trip() {
    let child: ChildReserve =
        pinned(r#"{"goal":"count the files","context":"in /work","toolsets":["terminal"]}"#);
    assert_eq!(
        child.toolsets.as_deref(),
        Some(&["terminal".to_string()][..])
    );
    assert_eq!(
        round_trip(&ChildReserve {
            goal: "g".into(),
            context: None,
            toolsets: None,
        }),
        r#"{"goal":"g"}"#
    );
    let prompt: PromptOpen = pinned(
        r#"{"kind":"approval","body":{"command":"rm -rf /tmp/x","description":"recursively delete"}}"#,
    );
    assert_eq!(prompt.kind, "approval");
}

#[test]
fn background_process_records_and_updates_round_trip() {
    for status in [
        ProcessStatus::Running,
        ProcessStatus::Exited,
        ProcessStatus::Killed,
        ProcessStatus::Lost,
    ] {
        assert_eq!(round_trip(&status), format!("\"{status}\""));
        assert_eq!(ProcessStatus::parse(status.as_str()), Some(status));
    }
    let record: BackgroundProcess = pinned(concat!(
        r#"{"id":"proc_2","pid":77,"start_time":null,"command":"make -j2","cwd":"/src","#,
        r#""log_path":"/h/logs/proc_2.log","status":"exited","exit_code":2,"started_at":0.0}"#
    ));
    assert_eq!(
        (record.status, record.exit_code),
        (ProcessStatus::Exited, Some(2))
    );
    let update: ProcessUpdate = pinned(r#"{"id":"proc_2","status":"killed","exit_code":null}"#);
    assert_eq!(update.status, ProcessStatus::Killed);
}

// ---------------------------------------------------------------------------------------------
// Job messages carried by worker frames and the policy (SPEC sections 3, 4 and 7)

#[test]
fn job_register_round_trips() {
    let register: JobRegister =
        pinned(r#"{"job_id":"job-20240101-abc","registry_dir":"/home/u/.drover/jobs"}"#);
    assert_eq!(register.job_id, "job-20240101-abc");
    // As the payload of its persist frame.
    let frame = WorkerFrame::Persist(PersistFrame {
        epoch: 1,
        execution_id: "x".into(),
        generation: 1,
        sequence: 9,
        operation: Operation::JobRegister(register.clone()),
        secret: "s".into(),
    });
    let text = round_trip(&frame);
    let back: WorkerFrame = serde_json::from_str(&text).unwrap();
    let WorkerFrame::Persist(p) = back else {
        panic!("{text}")
    };
    assert_eq!(p.operation, Operation::JobRegister(register));
}

#[test]
fn jobs_wire_and_mcp_server_settings_round_trip() {
    let wire: JobsWire = pinned(
        r#"{"url":"mqtts://broker:8883","username_env":"MQTT_USER","password_env":"MQTT_PASS","topic_base":"team/jobs"}"#,
    );
    assert_eq!(wire.url.as_deref(), Some("mqtts://broker:8883"));
    assert_eq!(
        round_trip(&JobsWire::default()),
        r#"{"url":null,"username_env":null,"password_env":null,"topic_base":null}"#
    );
    let server: McpServerSpec = pinned(
        r#"{"command":"npx","args":["-y","server"],"env":{"B":"2","a":"1"},"tool_timeout_s":5}"#,
    );
    assert_eq!(server.env.len(), 2);
    let bare: McpServerSpec = serde_json::from_str(r#"{"command":"x"}"#).unwrap();
    assert_eq!(
        round_trip(&bare),
        r#"{"command":"x","args":[],"env":{},"tool_timeout_s":600}"#
    );
}
