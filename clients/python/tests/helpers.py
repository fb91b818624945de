"""Bounded waits over a session's event stream."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from drover_client import Event, Session
from drover_client.types import SessionEventTurnSettled

from conftest import WAIT_S


class EventLog:
    """Iterates `session.events()` in a task and keeps what it yielded."""

    def __init__(self, session: Session, **options: Any) -> None:
        self.events: list[Event] = []
        self._changed = asyncio.Condition()
        self._ended = False
        self._task = asyncio.create_task(self._run(session, options))

    async def _run(self, session: Session, options: dict[str, Any]) -> None:
        try:
            async for event in session.events(**options):
                async with self._changed:
                    self.events.append(event)
                    self._changed.notify_all()
        finally:
            # Wake waiters so they see the end (and its error) at once.
            self._ended = True
            async with self._changed:
                self._changed.notify_all()

    @property
    def stored(self) -> list[Event]:
        """The yielded events that have a `seq` (everything but `message.delta`)."""
        return [e for e in self.events if e["seq"] is not None]

    async def wait_for(self, predicate: Callable[[Event], bool], timeout: float = WAIT_S) -> Event:
        """The first yielded event matching `predicate`, waiting at most `timeout` seconds."""

        def found() -> Event | None:
            return next((e for e in self.events if predicate(e)), None)

        async with asyncio.timeout(timeout):
            async with self._changed:
                while (event := found()) is None:
                    if self._ended:
                        await asyncio.wait({self._task})
                        self._task.result()  # raises what ended the iteration
                        raise AssertionError("the event stream ended")
                    await self._changed.wait()
                return event

    async def settled(self, admission_id: str, timeout: float = WAIT_S) -> SessionEventTurnSettled:
        event = await self.wait_for(
            lambda e: e["type"] == "turn.settled" and e["payload"]["admission_id"] == admission_id,
            timeout,
        )
        assert event["type"] == "turn.settled"
        return event

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


def assert_no_gap_no_repeat(events: list[Event], first: int = 1) -> None:
    seqs = [e["seq"] for e in events if e["seq"] is not None]
    assert seqs == list(range(first, first + len(seqs))), f"seq values {seqs}"
