"""The catch-up of `Session.events` against a scripted daemon that controls what is stored
when: after a reconnect (or a gap) the client reads back only what was stored up to the
re-attach (or up to the event that showed the gap); what came after arrives live, a turn's
deltas before its `message.complete`. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from conftest import WAIT_S
from drover_client import Client, Event

SESSION = "s-1"
EPOCH = "e-1"

#: What the daemon does after answering a request: (the daemon, the connection, which
#: connection it is (1 for the first), which request on it (1 for the first), its method).
AfterAnswer = Callable[["ScriptedDaemon", ServerConnection, int, int, str], Awaitable[None]]


def stored_event(seq: int, kind: str, payload: dict[str, Any]) -> dict[str, Any]:
    return {"session_id": SESSION, "seq": seq, "replay_epoch": EPOCH, "type": kind, "payload": payload}


def delta(text: str) -> dict[str, Any]:
    return {"session_id": SESSION, "seq": None, "replay_epoch": EPOCH, "type": "message.delta",
            "payload": {"text": text, "delta_index": 0}}


def complete(seq: int, text: str) -> dict[str, Any]:
    return stored_event(seq, "message.complete", {"role": "assistant", "content": text})


class ScriptedDaemon:
    """One session's stored events and a script run after each answer."""

    def __init__(self, after_answer: AfterAnswer) -> None:
        self.stored: list[dict[str, Any]] = [
            stored_event(1, "admission.updated", {"admission_id": "a-1", "status": "queued"}),
            stored_event(2, "turn.started", {"admission_id": "a-1", "execution_generation": 1}),
        ]
        self.after_answer = after_answer
        self.connections: list[ServerConnection] = []

    async def send_event(self, ws: ServerConnection, event: dict[str, Any]) -> None:
        await ws.send(json.dumps({"jsonrpc": "2.0", "method": "event", "params": event}))

    async def stream_message(self, ws: ServerConnection, seq: int, text: str) -> None:
        """A turn's message as the daemon sends it: its start streamed live, then the whole
        message stored (so `session.events.since` has it from now on) and sent live."""
        await self.send_event(ws, delta(text[:3]))
        self.stored.append(complete(seq, text))
        await self.send_event(ws, self.stored[-1])

    async def send_to_all(self, event: dict[str, Any]) -> None:
        for ws in self.connections:
            await self.send_event(ws, event)

    async def handle(self, ws: ServerConnection) -> None:
        self.connections.append(ws)
        connection = len(self.connections)
        with contextlib.suppress(ConnectionClosed):
            await self._serve(ws, connection)

    async def _serve(self, ws: ServerConnection, connection: int) -> None:
        requests = 0
        async for raw in ws:
            request = json.loads(raw)
            method, params = request["method"], request.get("params") or {}
            requests += 1
            if method == "session.resume":
                result: dict[str, Any] = {
                    "session_id": SESSION, "replay_epoch": EPOCH,
                    "last_sequence": self.stored[-1]["seq"], "execution_generation": 1,
                }
            elif method == "session.events.since":
                after = params["last_sequence"]
                result = {"events": [e for e in self.stored if e["seq"] > after], "has_more": False,
                          "snapshot_required": False}
            else:
                result = {}
            await ws.send(json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": result}))
            await self.after_answer(self, ws, connection, requests, method)


@asynccontextmanager
async def scripted(tmp_path: Path, after_answer: AfterAnswer) -> AsyncIterator[tuple[ScriptedDaemon, Client]]:
    daemon = ScriptedDaemon(after_answer)
    async with serve(daemon.handle, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        (tmp_path / "daemon.json").write_text(json.dumps({
            "pid": os.getpid(), "epoch": 1, "instance_id": "i-1",
            "url": f"ws://127.0.0.1:{port}/v1/ws", "token": "t", "started_at": 0.0,
        }))
        client = await Client.connect(tmp_path, backoff_initial=0.01)
        try:
            yield daemon, client
        finally:
            await client.close()


class Reader:
    """Runs `events` in a task of its own; `got` holds (`seq`, text or type) of each event."""

    def __init__(self, events: AsyncIterator[Event]) -> None:
        self.events = events
        self.got: list[tuple[Any, str]] = []
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        async for event in self.events:
            payload = event.get("payload")
            text = (payload.get("text") or payload.get("content")) if isinstance(payload, dict) else None
            self.got.append((event.get("seq"), str(text or event["type"])))

    async def until(self, count: int) -> list[tuple[Any, str]]:
        """The first `count` events, once they came (bounded)."""
        async def enough() -> None:
            while len(self.got) < count:
                if self.task.done():
                    self.task.result()
                    raise AssertionError(f"the stream ended after {self.got}")
                await asyncio.sleep(0.005)

        try:
            await asyncio.wait_for(enough(), WAIT_S)
        except TimeoutError:
            raise AssertionError(f"only {self.got} within {WAIT_S} s") from None
        return self.got[:count]

    async def close(self) -> None:
        self.task.cancel()
        try:
            await self.task
        except asyncio.CancelledError:
            pass


async def test_a_reconnect_reads_back_only_what_was_stored_before_the_session_was_attached_again(
    tmp_path: Path,
) -> None:
    async def after_answer(daemon: ScriptedDaemon, ws: ServerConnection, connection: int, request: int,
                           method: str) -> None:
        if connection == 2 and method == "session.resume":
            # On the new connection a turn goes on: its streamed text, then its message,
            # stored after the re-attach answered, so `session.events.since` has it too.
            await daemon.stream_message(ws, 4, "Hello")

    async with scripted(tmp_path, after_answer) as (daemon, client):
        session = await client.resume(SESSION)
        reader = Reader(session.events())
        # Live or read back, the stream has it once it listens on the first connection.
        daemon.stored.append(stored_event(3, "tool.start", {"tool_id": "t-1"}))
        await daemon.send_to_all(daemon.stored[-1])
        assert await reader.until(1) == [(3, "tool.start")]
        client.drop_connection()
        got = await reader.until(3)
        await reader.close()
    # Read back in full, message 4 came ahead of its own streamed text (or the text was lost).
    assert got == [(3, "tool.start"), (None, "Hel"), (4, "Hello")], got


async def test_a_gap_is_read_back_up_to_the_event_that_showed_it_and_no_further(tmp_path: Path) -> None:
    async def after_answer(daemon: ScriptedDaemon, ws: ServerConnection, connection: int, request: int,
                           method: str) -> None:
        if (connection, request) != (1, 2):  # the stream's first request, once it listens
            return
        # Event 3 is stored but never sent live (missed); 4 shows the gap; the turn's text and
        # its message 5 follow live, 5 stored before the client can ask for 3.
        daemon.stored.append(stored_event(3, "tool.start", {"tool_id": "t-1"}))
        daemon.stored.append(stored_event(4, "tool.complete", {"tool_id": "t-1"}))
        await daemon.send_event(ws, daemon.stored[-1])
        await daemon.stream_message(ws, 5, "Hello")

    async with scripted(tmp_path, after_answer) as (daemon, client):
        session = await client.resume(SESSION)
        reader = Reader(session.events())
        got = await reader.until(4)
        await reader.close()
    assert got == [(3, "tool.start"), (4, "tool.complete"), (None, "Hel"), (5, "Hello")], got
