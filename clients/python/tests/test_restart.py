"""The event stream across owner SIGKILLs and restarts: no seq skipped, none repeated."""

from __future__ import annotations

import asyncio
import threading

from drover_client import Client

from conftest import WAIT_S, Daemon
from fake_model import FakeModel, Reply
from helpers import EventLog, assert_no_gap_no_repeat


async def test_events_survive_owner_sigkill_and_restart(daemon: Daemon, model: FakeModel) -> None:
    client = await Client.connect(daemon.home, reconnect_timeout=WAIT_S, backoff_max=0.2)
    try:
        session = await client.create_session()
        log = EventLog(session, after=0)
        first = await session.submit("one")
        await log.settled(first["admission_id"])
        tokens = {daemon.info["token"]}

        for round_ in range(2):
            # A turn is running (its model request held) when the owner is killed.
            gate = threading.Event()
            model.push(Reply.say(f"lost {round_}").gated(gate))
            seen = len(model.requests)
            running = await session.submit(f"lost {round_}")
            await log.wait_for(
                lambda e: e["type"] == "turn.started" and e["payload"]["admission_id"] == running["admission_id"]
            )
            assert await asyncio.to_thread(model.wait_requests, seen + 1, WAIT_S)
            # Queued behind it: admitted before the kill, runs only after the restart.
            queued = await session.submit(f"queued {round_}")

            daemon.kill()
            gate.set()
            daemon.start()  # a new epoch, token and port
            tokens.add(str(daemon.info["token"]))

            lost = await log.settled(running["admission_id"])
            assert lost["payload"]["outcome"] == "unknown"
            receipt = await session.receipt(running["admission_id"])
            assert receipt["status"] == "unknown"
            resolved = await session.resolve_unknown(running["admission_id"])
            assert resolved["status"] == "terminal" and resolved["outcome"] == "interrupted"
            ran = await log.settled(queued["admission_id"])
            assert ran["payload"]["outcome"] == "completed"

        last = await session.submit("after")
        await log.settled(last["admission_id"])
        await log.close()

        assert len(tokens) == 3, "each restart hands out a new token"
        assert client.reconnects >= 2
        assert_no_gap_no_repeat(log.events)
        # What was yielded is exactly the stored stream, in order.
        page = await client.events_since(session.id, session.replay_epoch, 0)
        stored = [(e["seq"], e["type"]) for e in page["events"]]
        yielded = [(e["seq"], e["type"]) for e in log.stored]
        assert yielded == stored[: len(yielded)]
        assert len(yielded) >= len(stored) - 1  # at most the final admission.updated still in flight
    finally:
        await client.close()
