"""The client: `Client` (one home's daemon) and `Session` (one attached session).

Layers: `types` (wire shapes), `errors`, `_rpc` (one connection), this module (reconnecting
client, sessions, the event stream).

Every method of docs/protocol.md is safe to send again after a lost answer (`session.create`
by its `request_id`, `prompt.submit` and `session.compact` by their `input_id`, the rest because a second call only
reports what the first did), so a call whose connection drops is sent again on the next
connection, with the same ids, until the reconnect timeout.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import ssl
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypedDict, cast

from websockets.exceptions import InvalidHandshake

from ._rpc import DROPPED, Connection, DaemonRestarted, Dropped, EventQueue, open_connection
from .errors import (
    AuthenticationFailed,
    ConnectionLost,
    DaemonNotRunning,
    NotFound,
    ProtocolViolation,
)
from .types import (
    ApprovalChoice,
    ApprovalScope,
    ApprovalPrompt,
    ClarifyPrompt,
    CompactionResult,
    Event,
    EventsSince,
    InterruptResult,
    McpStatusResult,
    Pong,
    Receipt,
    RespondResult,
    SessionList,
    SessionSnapshot,
)


class DaemonInfo(TypedDict):
    """`<home>/daemon.json`, written by the daemon once it is ready (a file, not a wire type,
    so not in the protocol's schema)."""

    pid: int
    epoch: int
    instance_id: str
    url: str
    token: str
    started_at: float


SnapshotCallback = Callable[[SessionSnapshot], Awaitable[None] | None]
RestartCallback = Callable[[DaemonRestarted], Awaitable[None] | None]

log = logging.getLogger("drover_client")


class _Closed(Exception):
    """The client was closed (internal: ends event iteration quietly)."""


def default_home() -> Path:
    """`$DROVER_HOME`, else `~/.drover` (as the `drover` command picks it)."""
    env = os.environ.get("DROVER_HOME")
    return Path(env) if env else Path.home() / ".drover"


def read_daemon_info(home: Path) -> DaemonInfo:
    """Reads `<home>/daemon.json`; raises `DaemonNotRunning` when it is missing, malformed,
    or names a process that is not running."""
    path = home / "daemon.json"
    try:
        info = json.loads(path.read_text())
    except FileNotFoundError:
        raise DaemonNotRunning(home, f"{path} does not exist") from None
    except (OSError, ValueError) as e:
        raise DaemonNotRunning(home, f"{path} cannot be read: {e}") from None
    if not isinstance(info, dict):
        raise DaemonNotRunning(home, f"{path} is not a JSON object")
    for key, kind in (("url", str), ("token", str), ("pid", int)):
        if not isinstance(info.get(key), kind):
            raise DaemonNotRunning(home, f"{path} has no valid {key!r}")
    try:
        os.kill(info["pid"], 0)
    except ProcessLookupError:
        raise DaemonNotRunning(home, f"{path} names pid {info['pid']}, which is not running") from None
    except PermissionError:
        pass  # running, as another user
    return cast(DaemonInfo, info)


class Client:
    """A connection to one home's daemon that re-establishes itself.

    Create it with :meth:`Client.connect`. After a drop (or an owner restart), the next use
    reconnects with exponential backoff (from `backoff_initial` to `backoff_max` seconds),
    re-reading `daemon.json` each time (a new daemon has a new token and port), re-attaches
    every session this client created or resumed, and sends an unanswered call again. It
    gives up with `ConnectionLost` after `reconnect_timeout` seconds.

    A handoff (`drover restart`) is no loss: the old owner sends `daemon.restarted` and closes
    with code 1012, and the client reconnects at once to the next owner, waiting until
    `daemon.json` names it. Once connected it appends the notice (`from_version`,
    `to_version`, and the next owner's `epoch`) to `restarts`, logs "daemon restarted
    (version X -> Y)" at INFO, and calls `on_restart` with it. Event streams go on from their
    last `seq`: session sequence numbers do not change across a handoff.
    """

    def __init__(
        self,
        home: Path,
        *,
        reconnect_timeout: float = 30.0,
        backoff_initial: float = 0.05,
        backoff_max: float = 2.0,
        open_timeout: float = 5.0,
        ssl_context: ssl.SSLContext | None = None,
        on_restart: RestartCallback | None = None,
    ) -> None:
        self.home = home
        self.on_restart = on_restart
        #: Every handoff this client followed to the next owner, oldest first.
        self.restarts: list[DaemonRestarted] = []
        self.reconnect_timeout = reconnect_timeout
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.open_timeout = open_timeout
        self.ssl_context = ssl_context
        #: The `daemon.json` of the current connection.
        self.daemon: DaemonInfo | None = None
        #: How many times a dropped connection was re-established.
        self.reconnects = 0
        self._conn: Connection | None = None
        self._lock = asyncio.Lock()
        self._closed = False
        self._sessions: dict[str, Session] = {}

    @classmethod
    async def connect(
        cls,
        home: str | os.PathLike[str] | None = None,
        *,
        wait: float = 0.0,
        reconnect_timeout: float = 30.0,
        backoff_initial: float = 0.05,
        backoff_max: float = 2.0,
        open_timeout: float = 5.0,
        ssl_context: ssl.SSLContext | None = None,
        on_restart: RestartCallback | None = None,
    ) -> Client:
        """Connects to the daemon of `home` (default `$DROVER_HOME`, else `~/.drover`).

        With `wait` 0 a missing daemon raises `DaemonNotRunning` at once; otherwise the client
        keeps trying for `wait` seconds (for a daemon that is starting). `on_restart` (a
        function or coroutine function) is called after each handoff the client followed.
        """
        client = cls(
            Path(home).expanduser() if home is not None else default_home(),
            reconnect_timeout=reconnect_timeout,
            backoff_initial=backoff_initial,
            backoff_max=backoff_max,
            open_timeout=open_timeout,
            ssl_context=ssl_context,
            on_restart=on_restart,
        )
        if wait > 0:
            async with client._lock:
                client._conn = await client._reconnect(wait)
        else:
            client._conn = await client._open()
        return client

    async def close(self) -> None:
        """Closes the connection; event iterators of this client's sessions end."""
        self._closed = True
        if self._conn is not None:
            await self._conn.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- connection management -------------------------------------------------------------

    async def _open(self, *, not_from: DaemonInfo | None = None) -> Connection:
        info = read_daemon_info(self.home)
        if not_from is not None and (info["pid"], info.get("instance_id")) == (
            not_from["pid"],
            not_from.get("instance_id"),
        ):
            # The old owner's file: it may still accept on the address it shares with the
            # next owner until it exits.
            raise DaemonNotRunning(self.home, "the next daemon has not written daemon.json yet")
        conn = await open_connection(
            info["url"], info["token"], open_timeout=self.open_timeout, ssl_context=self.ssl_context
        )
        self.daemon = info
        return conn

    async def _reconnect(self, timeout: float, *, handoff: bool = False) -> Connection:
        """`handoff`: the daemon handed over; only the next owner's `daemon.json` will do."""
        old = self.daemon if handoff else None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        delay = self.backoff_initial
        while True:
            conn: Connection | None = None
            try:
                conn = await self._open(not_from=old)
                for session in list(self._sessions.values()):
                    # Its event streams listen before it is attached again: what the daemon
                    # sends from the attach on reaches them live, what it stored before is
                    # read back up to the attach's `last_sequence`, and nothing twice.
                    for queue in session._queues:
                        conn.subscribe(session.id, queue)
                    attached_at = await session._reattach(conn)
                    for queue in session._queues:
                        session._live_after[id(queue)] = attached_at
                return conn
            except AuthenticationFailed as e:
                if e.status != 401:  # 403 is not a stale token: retrying cannot help
                    raise
                last: BaseException = e
            except (DaemonNotRunning, OSError, TimeoutError, InvalidHandshake, Dropped) as e:
                last = e
            except BaseException:
                if conn is not None:
                    await conn.close()
                raise
            if conn is not None:
                await conn.close()
            if self._closed:
                raise _Closed()
            if loop.time() + delay > deadline:
                raise ConnectionLost(
                    f"could not reach the daemon of {self.home} within {timeout:g} s", last
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.backoff_max)

    async def _connection(self) -> Connection:
        """The open connection, re-established if it dropped."""
        async with self._lock:
            if self._closed:
                raise _Closed()
            if self._conn is not None and self._conn.is_open:
                return self._conn
            restart = self._conn.restart if self._conn is not None else None
            self._conn = await self._reconnect(self.reconnect_timeout, handoff=restart is not None)
            self.reconnects += 1
            conn = self._conn
            if restart is not None:
                epoch = self.daemon["epoch"] if self.daemon is not None else restart["epoch"]
                restart = DaemonRestarted(
                    from_version=restart["from_version"], to_version=restart["to_version"], epoch=epoch
                )
                self.restarts.append(restart)
        if restart is not None:
            log.info("daemon restarted (version %s -> %s)", restart["from_version"], restart["to_version"])
            # Outside the lock: the callback may call the daemon.
            if self.on_restart is not None:
                done = self.on_restart(restart)
                if inspect.isawaitable(done):
                    await done
        return conn

    def drop_connection(self) -> None:
        """Aborts the current connection as a network failure would (for tests and demos);
        the next use reconnects."""
        if self._conn is not None:
            self._conn.abort()

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """Sends one request (again after a drop, on the next connection) and returns its
        `result`. Raises an `RpcError` subclass for an error answer."""
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        while True:
            try:
                conn = await self._connection()
            except _Closed:
                raise ConnectionLost("the client is closed") from None
            try:
                return await conn.call(method, params)
            except Dropped as e:
                now = loop.time()
                deadline = deadline if deadline is not None else now + self.reconnect_timeout
                if now > deadline:
                    raise ConnectionLost(f"{method} got no answer within {self.reconnect_timeout:g} s", e) from e

    # ---- methods (docs/protocol.md, "Methods") ----------------------------------------------

    async def ping(self) -> Pong:
        return cast(Pong, await self.call("ping"))

    async def create_session(
        self,
        *,
        request_id: str | None = None,
        cwd: str | os.PathLike[str] | None = None,
        model: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        toolsets: list[str] | None = None,
        system_prompt: str | None = None,
        title: str | None = None,
        source: str | None = None,
        agent: str | None = None,
    ) -> Session:
        """`session.create`: creates a session and attaches this client to it. `request_id`
        (default: a new UUID) makes a retry return the same session. `agent` names an external
        agent of the daemon's `[agents.<name>]` config to run the session's turns (default:
        drover's own agent loop); an unknown name raises `InvalidParams` with `field ==
        "agent"`."""
        params: dict[str, Any] = {"request_id": request_id or str(uuid.uuid4())}
        optional = {
            "cwd": os.fspath(cwd) if cwd is not None else None,
            "model": model,
            "base_url": base_url,
            "api_key": api_key,
            "toolsets": toolsets,
            "system_prompt": system_prompt,
            "title": title,
            "source": source,
            "agent": agent,
        }
        params.update({k: v for k, v in optional.items() if v is not None})
        snapshot = cast(SessionSnapshot, await self.call("session.create", params))
        return self._session(snapshot)

    async def resume(self, session_id: str) -> Session:
        """`session.resume`: attaches this client to the session and returns it with its
        snapshot. Its event stream starts after the snapshot's `last_sequence`."""
        snapshot = cast(SessionSnapshot, await self.call("session.resume", {"session_id": session_id}))
        return self._session(snapshot)

    async def list_sessions(self, *, limit: int | None = None, cursor: str | None = None) -> SessionList:
        params: dict[str, Any] = {}
        if limit is not None:
            params["limit"] = limit
        if cursor is not None:
            params["cursor"] = cursor
        return cast(SessionList, await self.call("session.list", params))

    async def detach(self, session_id: str) -> None:
        """`session.detach`: stops this client's events of the session (the turn runs on)."""
        session = self._sessions.pop(session_id, None)
        if session is not None:
            session.attached = False
        await self.call("session.detach", {"session_id": session_id})

    async def submit(self, session_id: str, text: str, *, input_id: str | None = None) -> Receipt:
        """`prompt.submit`: answers once the admission is on disk. `input_id` (default: a new
        UUID) makes a retry return the same admission."""
        params = {"session_id": session_id, "input_id": input_id or str(uuid.uuid4()), "text": text}
        return cast(Receipt, await self.call("prompt.submit", params))

    async def compact(self, session_id: str, *, input_id: str | None = None) -> CompactionResult:
        """`session.compact`: compacts the session's older history (every turn but the last
        `keep_recent_turns`) as a turn run in queue order like an input, and answers once that
        turn settled: `{status: "compacted" | "nothing_to_compact", covered, admission_id}`.
        A compaction turn that fails, is cancelled or interrupted, or is lost raises the
        `RpcError` of its reason (`model_unavailable`, `stale_generation`, `unknown_execution`).
        `input_id` (default: a new UUID) makes a retry the same admission, with the same answer."""
        params = {"session_id": session_id, "input_id": input_id or str(uuid.uuid4())}
        return cast(CompactionResult, await self.call("session.compact", params))

    async def receipt(self, session_id: str, admission_id: str, *, include_result: bool = False) -> Receipt:
        params = {"session_id": session_id, "admission_id": admission_id, "include_result": include_result}
        return cast(Receipt, await self.call("prompt.receipt", params))

    async def cancel(self, session_id: str, admission_id: str) -> Receipt:
        """`prompt.cancel` of a queued admission."""
        params = {"session_id": session_id, "admission_id": admission_id}
        return cast(Receipt, await self.call("prompt.cancel", params))

    async def resolve_unknown(self, session_id: str, admission_id: str) -> Receipt:
        """`prompt.resolve_unknown`: settles an `unknown` admission `interrupted`."""
        params = {"session_id": session_id, "admission_id": admission_id}
        return cast(Receipt, await self.call("prompt.resolve_unknown", params))

    async def interrupt(self, session_id: str, execution_generation: int) -> InterruptResult:
        params = {"session_id": session_id, "execution_generation": execution_generation}
        return cast(InterruptResult, await self.call("session.interrupt", params))

    async def respond_approval(
        self,
        session_id: str,
        execution_generation: int,
        prompt_id: str,
        choice: ApprovalChoice,
        scope: ApprovalScope | None = None,
    ) -> RespondResult:
        """`scope` (with `always` only): where the stored rule applies, one of the prompt's
        `scopes`; None takes the daemon's default (the workspace when offered)."""
        params: dict[str, Any] = {
            "session_id": session_id,
            "execution_generation": execution_generation,
            "prompt_id": prompt_id,
            "choice": choice,
        }
        if scope is not None:
            params["scope"] = scope
        return cast(RespondResult, await self.call("approval.respond", params))

    async def respond_clarify(
        self, session_id: str, execution_generation: int, prompt_id: str, answer: str | list[str]
    ) -> RespondResult:
        params = {
            "session_id": session_id,
            "execution_generation": execution_generation,
            "prompt_id": prompt_id,
            "answer": answer,
        }
        return cast(RespondResult, await self.call("clarify.respond", params))

    async def events_since(self, session_id: str, replay_epoch: str, last_sequence: int) -> EventsSince:
        """`session.events.since`: one page of stored events (see `Session.events` for the
        stream that pages, reconnects and deduplicates)."""
        params = {"session_id": session_id, "replay_epoch": replay_epoch, "last_sequence": last_sequence}
        return cast(EventsSince, await self.call("session.events.since", params))

    async def mcp_status(self, session_id: str | None = None) -> McpStatusResult:
        """`mcp.status`: the home's MCP servers (or, with `session_id`, that session's) and
        where each stands; needs no attachment."""
        params = {} if session_id is None else {"session_id": session_id}
        return cast(McpStatusResult, await self.call("mcp.status", params))

    def _session(self, snapshot: SessionSnapshot) -> Session:
        session = self._sessions.get(snapshot["session_id"])
        if session is None:
            session = Session(self, snapshot)
            self._sessions[session.id] = session
        else:
            session._update(snapshot)
        session.attached = True
        return session


class Session:
    """A session this client is attached to (from `Client.create_session` / `Client.resume`)."""

    def __init__(self, client: Client, snapshot: SessionSnapshot) -> None:
        self.client = client
        self.id = snapshot["session_id"]
        #: The latest snapshot (refreshed at every reconnect and snapshot fallback).
        self.snapshot = snapshot
        self.replay_epoch = snapshot["replay_epoch"]
        #: The `seq` of the last stored event `events()` yielded (or the snapshot's position).
        self.last_sequence = snapshot["last_sequence"]
        #: The newest turn generation seen (snapshot, `turn.started`).
        self.execution_generation = snapshot["execution_generation"]
        self.attached = True
        #: The queues of the running `events()` iterators, subscribed on every new connection
        #: before the session is attached on it.
        self._queues: list[EventQueue] = []
        #: Per queue (by `id`): the `last_sequence` that the attach after its subscription on
        #: the current connection answered. Stored events after it reach the queue live.
        self._live_after: dict[int, int | None] = {}

    def _update(self, snapshot: SessionSnapshot) -> None:
        self.snapshot = snapshot
        self.execution_generation = max(self.execution_generation, snapshot["execution_generation"])

    async def _reattach(self, conn: Connection) -> int | None:
        """Attaches the session on a new connection; the answer's `last_sequence` (none when
        the session is gone)."""
        try:
            snapshot = cast(SessionSnapshot, await conn.call("session.resume", {"session_id": self.id}))
        except NotFound:
            self.client._sessions.pop(self.id, None)
            self.attached = False
            return None
        self._update(snapshot)
        return snapshot["last_sequence"]

    async def submit(self, text: str, *, input_id: str | None = None) -> Receipt:
        return await self.client.submit(self.id, text, input_id=input_id)

    async def compact(self, *, input_id: str | None = None) -> CompactionResult:
        return await self.client.compact(self.id, input_id=input_id)

    async def receipt(self, admission_id: str, *, include_result: bool = False) -> Receipt:
        return await self.client.receipt(self.id, admission_id, include_result=include_result)

    async def cancel(self, admission_id: str) -> Receipt:
        return await self.client.cancel(self.id, admission_id)

    async def resolve_unknown(self, admission_id: str) -> Receipt:
        return await self.client.resolve_unknown(self.id, admission_id)

    async def interrupt(self, execution_generation: int | None = None) -> InterruptResult:
        """Interrupts the turn of `execution_generation` (default: the newest one seen)."""
        generation = self.execution_generation if execution_generation is None else execution_generation
        return await self.client.interrupt(self.id, generation)

    async def respond_approval(
        self,
        prompt: ApprovalPrompt | Mapping[str, Any],
        choice: ApprovalChoice,
        scope: ApprovalScope | None = None,
    ) -> RespondResult:
        """Answers an approval prompt (an `approval.request` payload or a snapshot prompt);
        an `always` answer may name one of its `scopes` (docs/approvals.md)."""
        return await self.client.respond_approval(
            self.id, prompt["execution_generation"], prompt["prompt_id"], choice, scope
        )

    async def respond_clarify(
        self, prompt: ClarifyPrompt | Mapping[str, Any], answer: str | list[str]
    ) -> RespondResult:
        """Answers a clarify prompt (a `clarify.request` payload or a snapshot prompt)."""
        return await self.client.respond_clarify(
            self.id, prompt["execution_generation"], prompt["prompt_id"], answer
        )

    async def detach(self) -> None:
        await self.client.detach(self.id)

    async def events(
        self,
        *,
        after: int | None = None,
        on_snapshot: SnapshotCallback | None = None,
        deltas: bool = True,
    ) -> AsyncIterator[Event]:
        """The session's events, in `seq` order, each stored event exactly once.

        Starts after `after` (default: `last_sequence`, where the previous iteration stopped or
        the snapshot stood; 0 replays the whole stream). Across a dropped connection or an
        owner restart it reconnects (see `Client`), listening before the session is attached
        again, then reads back with `session.events.since` what was stored up to that attach
        (what came after arrives live, a turn's deltas before its `message.complete`); live
        events are deduplicated by `seq`. When the daemon answers
        `snapshot_required` (another `replay_epoch`, or a position ahead of the stream), it
        calls `session.resume`, passes the new snapshot to `on_snapshot`, and goes on from the
        snapshot's position. Live-only `message.delta` events (`seq` null) are yielded as they
        arrive unless `deltas` is false; they are never replayed. Never ends by itself: break
        out of the loop; it ends quietly when the client is closed, and raises
        `ConnectionLost` when reconnecting fails.
        """
        if after is not None:
            self.last_sequence = after
        queue: EventQueue = asyncio.Queue()
        self._queues.append(queue)
        conn: Connection | None = None
        try:
            while True:
                try:
                    conn = await self.client._connection()
                except _Closed:
                    return
                try:
                    if not conn.holds(self.id, queue):
                        conn.subscribe(self.id, queue)
                        if not self.attached:
                            # Listening first, then attached, so the attach's `last_sequence`
                            # is where the live events take over.
                            self._live_after[id(queue)] = await self._attach(conn)
                    # Stored events up to the attach are read back; those after it come live
                    # (a turn's deltas before its `message.complete`, never after it). A stream
                    # that starts on a session attached already reads back everything stored
                    # since its position, as does one whose session could not be attached again.
                    upto = self._live_after.pop(id(queue), None)
                    async for event in self._catch_up(conn, on_snapshot, upto):
                        yield event
                    while True:
                        item = await queue.get()
                        if item is DROPPED:
                            break
                        event = cast(Event, item)
                        seq = event.get("seq")
                        if seq is None:
                            if deltas:
                                yield event
                            continue
                        if event.get("replay_epoch") != self.replay_epoch:
                            async for caught in self._catch_up(conn, on_snapshot):
                                yield caught
                            continue
                        if seq > self.last_sequence + 1:
                            # A gap: read back what is missing, up to this event only (what
                            # follows it is behind it in the queue).
                            async for caught in self._catch_up(conn, on_snapshot, seq - 1):
                                yield caught
                            if seq > self.last_sequence + 1:
                                async for caught in self._catch_up(conn, on_snapshot):
                                    yield caught
                                continue
                        if seq <= self.last_sequence:
                            continue
                        self._seen(event)
                        yield event
                except Dropped:
                    pass
        finally:
            self._queues.remove(queue)
            self._live_after.pop(id(queue), None)
            if conn is not None:
                conn.unsubscribe(self.id, queue)

    async def _attach(self, conn: Connection) -> int:
        """Attaches the session on `conn`; the answer's `last_sequence`."""
        snapshot = cast(SessionSnapshot, await conn.call("session.resume", {"session_id": self.id}))
        self._update(snapshot)
        self.client._sessions[self.id] = self
        self.attached = True
        return snapshot["last_sequence"]

    def _seen(self, event: Event) -> None:
        seq = event["seq"]
        assert seq is not None
        self.last_sequence = seq
        payload = event.get("payload")
        # An event of a type this client does not know (a newer daemon) or `event.unreadable`
        # is yielded as it came: only its `seq` counts here.
        if event["type"] == "turn.started" and isinstance(payload, dict):
            generation = payload.get("execution_generation")
            if isinstance(generation, int):
                self.execution_generation = max(self.execution_generation, generation)

    async def _catch_up(
        self, conn: Connection, on_snapshot: SnapshotCallback | None, upto: int | None = None
    ) -> AsyncIterator[Event]:
        """Yields the stored events after `last_sequence`, page by page, until the stream's end
        or, with `upto`, until the event of that `seq` (later ones arrive live)."""
        resyncs = 0
        while True:
            if upto is not None and self.last_sequence >= upto:
                return
            page = cast(
                EventsSince,
                await conn.call(
                    "session.events.since",
                    {"session_id": self.id, "replay_epoch": self.replay_epoch, "last_sequence": self.last_sequence},
                ),
            )
            if page.get("snapshot_required"):
                resyncs += 1
                if resyncs > 3:
                    raise ProtocolViolation(
                        f"session.events.since of session {self.id} keeps answering snapshot_required"
                    )
                snapshot = cast(SessionSnapshot, await conn.call("session.resume", {"session_id": self.id}))
                self._update(snapshot)
                self.replay_epoch = snapshot["replay_epoch"]
                self.last_sequence = snapshot["last_sequence"]
                if on_snapshot is not None:
                    done = on_snapshot(snapshot)
                    if inspect.isawaitable(done):
                        await done
                continue
            events = page.get("events", [])
            for event in events:
                seq = event.get("seq")
                if seq is None or seq <= self.last_sequence:
                    continue
                if upto is not None and seq > upto:
                    return
                if seq != self.last_sequence + 1:
                    raise ProtocolViolation(
                        f"session.events.since of session {self.id} skipped from seq {self.last_sequence} to {seq}"
                    )
                self._seen(event)
                yield event
            more = page["has_more"] if "has_more" in page else bool(events)
            if not more:
                return
