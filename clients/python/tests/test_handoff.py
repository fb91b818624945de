"""The event stream across `drover restart`: the next owner adopts the running turn, and the
client follows it there with no seq skipped or repeated, telling the caller of the handoff."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time

from drover_client import Client, DaemonRestarted, read_daemon_info

from conftest import WAIT_S, Daemon, drover_bin
from fake_model import FakeModel, Reply
from helpers import EventLog, assert_no_gap_no_repeat


def stop_owner(pid: int) -> None:
    """SIGTERM the home's owner now (the next owner is not this process's child), bounded."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)


async def test_events_go_on_across_a_handoff_and_the_caller_hears_of_it(
    daemon: Daemon, model: FakeModel
) -> None:
    notices: list[DaemonRestarted] = []
    client = await Client.connect(daemon.home, reconnect_timeout=WAIT_S, on_restart=notices.append)
    before = read_daemon_info(daemon.home)
    next_pid = None
    try:
        session = await client.create_session()
        log = EventLog(session, after=0)
        gate = threading.Event()
        model.push(Reply.say("answered after the restart").gated(gate))
        running = await session.submit("hold on")
        await log.wait_for(
            lambda e: e["type"] == "turn.started" and e["payload"]["admission_id"] == running["admission_id"]
        )
        assert await asyncio.to_thread(model.wait_requests, 1, WAIT_S)
        # Queued behind it: runs under the next owner.
        queued = await session.submit("then this")

        out = await asyncio.to_thread(
            subprocess.run,
            [str(drover_bin()), "--home", str(daemon.home), "restart"],
            capture_output=True,
            timeout=WAIT_S,
        )
        assert out.returncode == 0, out.stderr.decode(errors="replace")
        after = read_daemon_info(daemon.home)
        next_pid = after["pid"]
        assert next_pid != before["pid"] and after["epoch"] > before["epoch"]
        model.push(Reply.say("and then that"))
        gate.set()

        settled = await log.settled(running["admission_id"])
        assert settled["payload"]["outcome"] == "completed"
        ran = await log.settled(queued["admission_id"])
        assert ran["payload"]["outcome"] == "completed"
        await log.close()

        assert len(notices) == 1, notices
        notice = notices[0]
        assert notice["epoch"] == after["epoch"]
        assert notice["from_version"] and notice["from_version"] == notice["to_version"]
        assert client.restarts == notices
        assert_no_gap_no_repeat(log.events)
        page = await client.events_since(session.id, session.replay_epoch, 0)
        stored = [(e["seq"], e["type"]) for e in page["events"]]
        yielded = [(e["seq"], e["type"]) for e in log.stored]
        assert yielded == stored[: len(yielded)]
        assert len(yielded) >= len(stored) - 1  # at most the final admission.updated in flight
        # The held request was adopted, not sent again: one request per turn.
        assert len(model.requests) == 2
    finally:
        await client.close()
        if next_pid is not None:
            # The old owner exited on its own once it handed over.
            assert daemon.proc is not None
            assert daemon.proc.wait(timeout=WAIT_S) == 0
            daemon.proc = None
            stop_owner(next_pid)
