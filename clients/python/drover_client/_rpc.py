"""One WebSocket connection to the daemon: JSON-RPC requests and routed event notifications.

A `Connection` never reconnects; when it drops, every pending call fails with `Dropped` and
every event subscriber receives `DROPPED`. Reconnecting is the client's job (`client.py`).
A connection the daemon closed because it handed the home to its next owner (the
`daemon.restarted` notification, then close code 1012) says so in `restart`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import ssl
from typing import Any, Final, TypedDict

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from .errors import AuthenticationFailed, error_from_wire
from .types import Event

log = logging.getLogger("drover_client")

#: The daemon's message bound (docs/protocol.md, "Messages").
MAX_MESSAGE: Final = 16 * 1024 * 1024

#: The notification a connection gets before its daemon closes it for a handoff.
DAEMON_RESTARTED: Final = "daemon.restarted"

#: The WebSocket close code of a handoff ("service restart").
RESTART_CLOSE_CODE: Final = 1012


class DaemonRestarted(TypedDict):
    """The params of `daemon.restarted`: the daemon handed the home to its next owner
    (`drover restart`), which serves on the same address and carries the running turns on."""

    from_version: str
    to_version: str
    #: The next owner's runtime epoch.
    epoch: int


def restart_from_reason(reason: str) -> DaemonRestarted:
    """The versions of a 1012 close's reason, "the daemon restarted (version X -> Y)" (for a
    close whose notification was missed); unknown parts stay empty, the epoch 0."""
    match = re.search(r"\(version (\S+) -> (\S+)\)", reason)
    if match is None:
        return DaemonRestarted(from_version="", to_version="", epoch=0)
    return DaemonRestarted(from_version=match.group(1), to_version=match.group(2), epoch=0)


class Dropped(Exception):
    """The connection closed before the answer came (internal: the client retries)."""


class _DroppedMarker:
    def __repr__(self) -> str:
        return "DROPPED"


#: Put into every subscriber queue when the connection closes.
DROPPED: Final = _DroppedMarker()

EventQueue = asyncio.Queue[Event | _DroppedMarker]


class Connection:
    """An open, authenticated connection. Create it with :func:`open_connection`."""

    def __init__(self, ws: ClientConnection) -> None:
        self._ws = ws
        self._next_id = 0
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._subscribers: dict[str, list[EventQueue]] = {}
        self._closed = False
        #: Set when the daemon handed the home over (its notification, or a 1012 close).
        self.restart: DaemonRestarted | None = None
        self._reader = asyncio.get_running_loop().create_task(self._read())

    @property
    def is_open(self) -> bool:
        return not self._closed

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """Sends one request and returns its `result`; raises an `RpcError` subclass for an
        error answer and `Dropped` when the connection closes first."""
        if self._closed:
            raise Dropped(method)
        self._next_id += 1
        request_id = self._next_id
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        try:
            await self._ws.send(json.dumps(message))
            answer = await future
        except ConnectionClosed as e:
            raise Dropped(method) from e
        finally:
            self._pending.pop(request_id, None)
            # A send that failed as the connection closed (a handoff's close) leaves the
            # reader's `Dropped` on the future: retrieved here, as the `Dropped` raised above.
            if future.done() and not future.cancelled():
                future.exception()
        if "error" in answer:
            raise error_from_wire(method, answer["error"])
        return answer.get("result")

    def subscribe(self, session_id: str, queue: EventQueue | None = None) -> EventQueue:
        """`queue` (a new one if none) receives every event of `session_id` this connection
        gets from now on, then `DROPPED` once the connection closes."""
        if queue is None:
            queue = asyncio.Queue()
        if self._closed:
            queue.put_nowait(DROPPED)
        elif not self.holds(session_id, queue):
            self._subscribers.setdefault(session_id, []).append(queue)
        return queue

    def holds(self, session_id: str, queue: EventQueue) -> bool:
        """Whether `queue` receives this connection's events of `session_id`."""
        return any(held is queue for held in self._subscribers.get(session_id, []))

    def unsubscribe(self, session_id: str, queue: EventQueue) -> None:
        queues = self._subscribers.get(session_id, [])
        for i, held in enumerate(queues):
            if held is queue:
                del queues[i]
                break
        if not queues:
            self._subscribers.pop(session_id, None)

    async def close(self) -> None:
        await self._ws.close()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader

    def abort(self) -> None:
        """Drops the TCP connection without a closing handshake (as a network failure would)."""
        self._ws.transport.abort()

    async def _read(self) -> None:
        try:
            async for raw in self._ws:
                self._dispatch(raw)
        except ConnectionClosed as e:
            log.debug("connection closed: %s", e)
        finally:
            if self.restart is None and self._ws.close_code == RESTART_CLOSE_CODE:
                self.restart = restart_from_reason(self._ws.close_reason or "")
            self._closed = True
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(Dropped("connection closed"))
            for queues in self._subscribers.values():
                for queue in queues:
                    queue.put_nowait(DROPPED)
            self._subscribers.clear()

    def _dispatch(self, raw: str | bytes) -> None:
        try:
            message = json.loads(raw)
        except ValueError:
            log.warning("ignoring a frame that is not JSON")
            return
        if not isinstance(message, dict):
            return
        if message.get("method") == DAEMON_RESTARTED:
            params = message.get("params")
            if isinstance(params, dict):
                epoch = params.get("epoch")
                self.restart = DaemonRestarted(
                    from_version=str(params.get("from_version", "")),
                    to_version=str(params.get("to_version", "")),
                    epoch=epoch if isinstance(epoch, int) else 0,
                )
            return
        if message.get("method") == "event":
            params = message.get("params")
            if isinstance(params, dict):
                for queue in self._subscribers.get(str(params.get("session_id")), []):
                    queue.put_nowait(params)  # type: ignore[arg-type]
            return
        request_id = message.get("id")
        future = self._pending.get(request_id) if isinstance(request_id, int) else None
        if future is not None and not future.done():
            future.set_result(message)


async def open_connection(
    url: str, token: str, *, open_timeout: float, ssl_context: ssl.SSLContext | None
) -> Connection:
    """Opens and authenticates a connection. Raises `AuthenticationFailed` on HTTP 401/403,
    `OSError` or `TimeoutError` when the daemon cannot be reached."""
    try:
        ws = await connect(
            url,
            additional_headers={"Authorization": f"Bearer {token}"},
            open_timeout=open_timeout,
            max_size=MAX_MESSAGE,
            proxy=None,
            ssl=ssl_context if url.startswith("wss://") else None,
        )
    except InvalidStatus as e:
        status = e.response.status_code
        if status in (401, 403):
            raise AuthenticationFailed(url, status) from e
        raise OSError(f"the daemon at {url} answered the upgrade with HTTP {status}") from e
    return Connection(ws)
