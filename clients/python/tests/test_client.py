"""The client against the real daemon: turns, prompts, typed errors, dropped connections."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from pathlib import Path

import pytest

from drover_client import (
    AdmissionConflict,
    Client,
    DaemonNotRunning,
    InvalidParams,
    NotFound,
    PermissionDenied,
    SessionSnapshot,
    StaleGeneration,
    UnknownMethod,
)

from conftest import WAIT_S, Daemon, write_config
from fake_model import FakeModel, Reply
from helpers import EventLog, assert_no_gap_no_repeat


async def connect(daemon: Daemon) -> Client:
    return await Client.connect(daemon.home, reconnect_timeout=WAIT_S, backoff_max=0.2)


async def test_a_turn_streams_and_settles(daemon: Daemon, model: FakeModel, tmp_path: Path) -> None:
    model.push(Reply.say("hello there, world"))
    async with await connect(daemon) as client:
        assert await client.ping() == {"pong": True}
        session = await client.create_session(cwd=tmp_path, title="py")
        assert session.snapshot["info"]["title"] == "py"
        log = EventLog(session)
        receipt = await session.submit("hi")
        assert receipt["status"] in ("queued", "started")
        settled = await log.settled(receipt["admission_id"])
        assert settled["payload"]["outcome"] == "completed"
        done = await log.wait_for(lambda e: e["type"] == "admission.updated" and e["payload"]["status"] == "terminal")
        await log.close()

        types = [e["type"] for e in log.stored[: log.stored.index(done) + 1]]
        assert types[:3] == ["admission.updated", "admission.updated", "turn.started"]
        assert types[-3:] == ["message.complete", "turn.settled", "admission.updated"]
        assert_no_gap_no_repeat(log.events)
        deltas = [e for e in log.events if e["type"] == "message.delta"]
        assert deltas and all(e["seq"] is None for e in deltas)
        assert "".join(e["payload"]["text"] for e in deltas) == "hello there, world"

        final = await session.receipt(receipt["admission_id"], include_result=True)
        assert final["status"] == "terminal" and final["outcome"] == "completed"
        result = final.get("result")
        assert result is not None and result["final_response"] == "hello there, world"
        # The same input_id is the same admission, never a second one.
        again = await session.submit("hi", input_id="fixed")
        assert (await session.submit("hi", input_id="fixed"))["admission_id"] == again["admission_id"]


async def test_errors_are_typed(daemon: Daemon, model: FakeModel) -> None:
    gate = threading.Event()
    model.push(Reply.say("slow").gated(gate))
    async with await connect(daemon) as client:
        with pytest.raises(InvalidParams) as bad_cwd:
            await client.create_session(cwd="relative/dir")
        assert bad_cwd.value.field == "cwd"
        assert bad_cwd.value.reason == "invalid_params" and bad_cwd.value.code == -32602

        with pytest.raises(NotFound) as missing:
            await client.resume("no-such-session")
        assert missing.value.reason == "not_found"

        with pytest.raises(UnknownMethod):
            await client.call("session.explode", {})

        session = await client.create_session()
        with pytest.raises(InvalidParams) as bad_type:
            await client.call("prompt.submit", {"session_id": session.id, "input_id": 7, "text": "x"})
        assert bad_type.value.field == "input_id"

        await session.submit("one", input_id="in-1")
        with pytest.raises(AdmissionConflict):
            await session.submit("another text", input_id="in-1")

        with pytest.raises(StaleGeneration):
            await session.interrupt(execution_generation=99)

        # Another connection that has not attached may read but not submit.
        async with await connect(daemon) as other:
            with pytest.raises(PermissionDenied):
                await other.call("prompt.submit", {"session_id": session.id, "input_id": "x", "text": "x"})
            page = await other.events_since(session.id, session.replay_epoch, 0)
            assert page["snapshot_required"] is False and page["events"]
            # MCP server status is a read too: no server is configured here.
            assert await other.mcp_status() == {"servers": []}
            assert await other.mcp_status(session.id) == {"servers": []}
            with pytest.raises(NotFound):
                await other.mcp_status("no-such-session")
        gate.set()


async def test_daemon_not_running(tmp_path: Path) -> None:
    with pytest.raises(DaemonNotRunning):
        await Client.connect(tmp_path)
    # A daemon.json left by a killed daemon names a pid that is gone.
    dead = await asyncio.create_subprocess_exec("true")
    await dead.wait()
    (tmp_path / "daemon.json").write_text(
        json.dumps({"pid": dead.pid, "url": "ws://127.0.0.1:9/v1/ws", "token": "t", "epoch": 1})
    )
    with pytest.raises(DaemonNotRunning) as stale:
        await Client.connect(tmp_path)
    assert "not running" in str(stale.value)


async def test_approval_and_clarify_prompts(daemon: Daemon, model: FakeModel, tmp_path: Path) -> None:
    (tmp_path / "scratch").mkdir()
    model.push(Reply.call("call_1", "terminal", {"command": "rm -rf scratch"}))
    model.push(Reply.call("call_2", "clarify", {"questions": [{"question": "Colour?", "choices": ["red", "blue"]}]}))
    model.push(Reply.say("done"))
    async with await connect(daemon) as client:
        session = await client.create_session(cwd=tmp_path, toolsets=["terminal", "clarify"])
        log = EventLog(session)
        receipt = await session.submit("clean up")

        approval = await log.wait_for(lambda e: e["type"] == "approval.request")
        assert approval["type"] == "approval.request"
        prompt = approval["payload"]
        assert prompt["kind"] == "approval" and prompt["command"] == "rm -rf scratch"
        # Where an `always` answer may apply, in words; a scope goes with `always` only.
        assert [o["scope"] for o in prompt["scopes"]] == ["workspace", "everywhere"]
        assert prompt["scopes"][0]["text"].startswith("every command that deletes files recursively, in ")
        with pytest.raises(InvalidParams) as bad_scope:
            await session.respond_approval(prompt, "once", "workspace")
        assert bad_scope.value.field == "scope"
        answer = await session.respond_approval(prompt, "deny")
        assert answer["status"] == "resolved"
        again = await session.respond_approval(prompt, "once")
        assert again["status"] == "already_resolved"

        question = await log.wait_for(lambda e: e["type"] == "clarify.request")
        with pytest.raises(InvalidParams) as bad:
            await session.respond_clarify(question["payload"], "green")
        assert bad.value.field == "answer"
        await session.respond_clarify(question["payload"], "blue")

        settled = await log.settled(receipt["admission_id"])
        assert settled["payload"]["outcome"] == "completed"
        await log.close()
        assert (tmp_path / "scratch").is_dir(), "a denied command must not run"
        assert_no_gap_no_repeat(log.events)


async def test_cancel_a_queued_input(daemon: Daemon, model: FakeModel) -> None:
    gate = threading.Event()
    model.push(Reply.say("first").gated(gate))
    async with await connect(daemon) as client:
        session = await client.create_session()
        log = EventLog(session)
        first = await session.submit("first")
        second = await session.submit("second")
        cancelled = await session.cancel(second["admission_id"])
        assert cancelled["status"] == "terminal" and cancelled["outcome"] == "cancelled"
        gate.set()
        await log.settled(first["admission_id"])
        await log.close()


async def test_a_dropped_connection_loses_and_repeats_nothing(daemon: Daemon, model: FakeModel) -> None:
    async with await connect(daemon) as client:
        session = await client.create_session()
        log = EventLog(session)
        first = await session.submit("one")
        await log.settled(first["admission_id"])
        gate = threading.Event()
        model.push(Reply.say("two").gated(gate))
        second = await session.submit("two")
        await log.wait_for(lambda e: e["type"] == "turn.started" and e["payload"]["admission_id"] == second["admission_id"])
        # Drop while the turn runs; its events are stored meanwhile and must come exactly once.
        client.drop_connection()
        gate.set()
        third = await session.submit("three")  # sent again on the new connection if needed
        await log.settled(third["admission_id"])
        await log.close()
        assert client.reconnects >= 1
        assert_no_gap_no_repeat(log.events)
        assert [e["type"] for e in log.stored].count("turn.settled") == 3


async def test_snapshot_required_falls_back_to_resume(daemon: Daemon, model: FakeModel) -> None:
    async with await connect(daemon) as client:
        session = await client.create_session()
        log = EventLog(session)
        first = await session.submit("one")
        await log.settled(first["admission_id"])
        await log.close()
        position = session.last_sequence

        # A replay epoch the daemon does not know: the stream must rebuild from a snapshot.
        real_epoch = session.replay_epoch
        session.replay_epoch = "not-the-epoch"
        snapshots: list[SessionSnapshot] = []
        log = EventLog(session, after=0, on_snapshot=snapshots.append)
        # The stream resyncs first; a turn that settled before its snapshot would be part of
        # the snapshot, not of the stream.
        async with asyncio.timeout(WAIT_S):
            while not snapshots:
                await asyncio.sleep(0.005)
        second = await session.submit("two")
        await log.settled(second["admission_id"])
        await log.close()
        assert len(snapshots) == 1 and session.replay_epoch == real_epoch
        assert snapshots[0]["last_sequence"] >= position
        assert_no_gap_no_repeat(log.events, first=snapshots[0]["last_sequence"] + 1)


async def test_the_example_script_runs_a_turn(daemon: Daemon, model: FakeModel) -> None:
    model.push(Reply.call("call_1", "terminal", {"command": "echo from-the-tool"}))
    model.push(Reply.say("The command printed: from-the-tool"))
    script = Path(__file__).resolve().parents[1] / "examples" / "run_prompt.py"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), "--home", str(daemon.home), "say something",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(WAIT_S):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()
    assert "The command printed: from-the-tool" in out.decode()
    assert "[tool terminal: echo from-the-tool]" in err.decode()


async def test_interrupt_the_running_turn(daemon: Daemon, model: FakeModel) -> None:
    gate = threading.Event()
    model.push(Reply.say("never sent").gated(gate))
    async with await connect(daemon) as client:
        session = await client.create_session()
        log = EventLog(session)
        receipt = await session.submit("long")
        started = await log.wait_for(lambda e: e["type"] == "turn.started")
        assert started["type"] == "turn.started"
        assert session.execution_generation == started["payload"]["execution_generation"]
        assert await session.interrupt() == {"execution_state": "interrupting"}
        settled = await log.settled(receipt["admission_id"])
        gate.set()
        await log.close()
        assert settled["payload"]["outcome"] == "interrupted", settled


async def test_compact_summarises_the_older_turns(daemon: Daemon, model: FakeModel) -> None:
    async with await connect(daemon) as client:
        session = await client.create_session()
        log = EventLog(session)
        for i in range(3):
            model.push(Reply.say(f"answer {i}"))
            await log.settled((await session.submit(f"turn {i}"))["admission_id"])
        model.push(Reply.say("a summary of turn 0"))
        answer = await session.compact(input_id="compact-1")
        assert answer["status"] == "compacted" and answer["covered"] == 2, answer
        again = await session.compact(input_id="compact-1")
        assert again == answer
        settled = await log.settled(answer["admission_id"])
        assert settled["payload"]["outcome"] == "completed"
        await log.close()
        compacted = [e for e in log.stored if e["type"] == "session.compacted"]
        assert len(compacted) == 1
        event = compacted[0]
        assert event["type"] == "session.compacted"
        assert event["payload"]["covered"] == 2
        final = await session.receipt(answer["admission_id"], include_result=True)
        result = final.get("result")
        assert result is not None and result["final_response"] == "compacted 2 messages"
        summary_request = model.requests[-1]["messages"]
        assert summary_request[0]["content"].startswith("You are compacting")


async def test_an_unknown_or_unreadable_stored_event_does_not_break_the_stream(
    daemon: Daemon, tmp_path: Path
) -> None:
    """A stored event of a type this client does not know (a newer daemon), one whose payload
    is not JSON and one that no longer fits its type: `events()` yields each in `seq` order
    (the damaged ones as `event.unreadable`) and goes on."""
    import sqlite3

    async with await connect(daemon) as client:
        session = await client.create_session(cwd=tmp_path)
        db = sqlite3.connect(daemon.home / "state.db", timeout=WAIT_S)
        try:
            last = db.execute(
                "SELECT COALESCE(MAX(seq), 0) FROM session_events WHERE session_id = ?", (session.id,)
            ).fetchone()[0]
            rows = [
                ("turn.rewound", '{"to": 1}'),
                ("tool.start", "{not json"),
                ("tool.start", '{"tool_id": 12}'),
                ("turn.started", '{"admission_id": "a-1", "execution_generation": 7}'),
            ]
            with db:
                for i, (kind, payload) in enumerate(rows):
                    db.execute(
                        "INSERT INTO session_events (session_id, seq, type, payload_json, created_at)"
                        " VALUES (?, ?, ?, ?, 0)",
                        (session.id, last + 1 + i, kind, payload),
                    )
        finally:
            db.close()

        seen: list[dict[str, object]] = []

        async def read() -> None:
            async for event in session.events(after=last):
                seen.append(dict(event))
                if len(seen) == len(rows):
                    return

        await asyncio.wait_for(read(), WAIT_S)
        assert [e["seq"] for e in seen] == [last + 1 + i for i in range(len(rows))]
        assert seen[0]["type"] == "turn.rewound" and seen[0]["payload"] == {"to": 1}
        for damaged in seen[1:3]:
            assert damaged["type"] == "event.unreadable", damaged
            assert damaged["payload"]["type"] == "tool.start", damaged  # type: ignore[index]
        assert seen[3]["type"] == "turn.started"
        assert session.execution_generation == 7


async def test_a_session_may_run_a_configured_external_agent(home: Path, model: FakeModel) -> None:
    write_config(home, model.base_url)
    with open(home / "config.toml", "a") as config:
        config.write('\n[agents.codex]\ncommand = ["codex-acp"]\n\n[agents.opencode]\ncommand = ["opencode", "acp"]\n')
    daemon = Daemon(home).start()
    try:
        async with await connect(daemon) as client:
            with pytest.raises(InvalidParams) as unknown:
                await client.create_session(agent="nosuch")
            assert unknown.value.field == "agent"
            assert "codex, opencode" in unknown.value.detail
            session = await client.create_session(agent="codex", title="with codex")
            assert session.snapshot["info"].get("agent") == "codex"
            own = await client.create_session(title="drover's own")
            assert own.snapshot["info"].get("agent") is None
            rows = (await client.list_sessions())["sessions"]
            assert {r["session_id"]: r.get("agent") for r in rows} == {session.id: "codex", own.id: None}
    finally:
        daemon.stop()
