"""A session of a real external agent (Codex through codex-acp, docs/agents.md) watched by this
client while its approval is answered from the CLI.

The agent runs against a scriptable mock model set up by `drover-agent-setup` (a program of
crates/test-support, built beside `drover`): the same set-up as the Rust tests' `AgentKit::codex`,
so this file keeps no copy of Codex's configuration, and a model that speaks the Responses API.
Needs the npm packages of tests/agents (`npm ci --prefix tests/agents --ignore-scripts`, which
`scripts/test.sh` runs): without them the test is skipped, saying so.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from drover_client import Client, Event

from conftest import REPO, Daemon, drover_bin
from helpers import EventLog, assert_no_gap_no_repeat

#: The bound of each wait on the agent: its process starts for every turn (a second or two).
AGENT_WAIT_S = 60.0


def agent_setup_bin() -> Path:
    """`$DROVER_AGENT_SETUP_BIN`, else `drover-agent-setup` beside the `drover` binary."""
    path = Path(os.environ.get("DROVER_AGENT_SETUP_BIN") or drover_bin().with_name("drover-agent-setup"))
    if not path.is_file():
        pytest.fail(
            f"{path} does not exist: build it with "
            "`cargo build -p drover-test-support --bin drover-agent-setup`"
        )
    return path


class AgentModel:
    """A `drover-agent-setup codex DIR` child: the agent's set-up and its mock model."""

    def __init__(self, agent: str, folder: Path) -> None:
        self._stderr_path = folder / "agent-setup.stderr"
        with open(self._stderr_path, "wb") as stderr:
            self.proc = subprocess.Popen(
                [str(agent_setup_bin()), agent, str(folder)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
            )
        hello = self._line("its set-up")
        #: The `[agents.<name>]` entry of drover's config.toml.
        self.config_toml: str = hello["config_toml"]
        self.name: str = hello["name"]

    def _line(self, what: str) -> dict[str, Any]:
        """The next JSON line of its stdout, within the bound."""
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], AGENT_WAIT_S)
        line = self.proc.stdout.readline() if ready else b""
        if not line:
            code = self.proc.poll()
            stderr = self._stderr_path.read_text(errors="replace")
            raise AssertionError(f"drover-agent-setup gave no {what} (exit code {code}): {stderr}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def push(self, step: dict[str, str]) -> None:
        """Appends a reply to the model's script (`{"text": ...}` or `{"shell": COMMAND}`)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(step).encode() + b"\n")
        self.proc.stdin.flush()
        assert "pushed" in self._line(f"acknowledgement of {step}")

    def close(self) -> None:
        """Ends it at the end of its stdin; killed if it does not go in time. Reaped either way."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=AGENT_WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=AGENT_WAIT_S)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def codex(tmp_path: Path) -> Iterator[AgentModel]:
    modules = REPO / "tests" / "agents" / "node_modules"
    if not modules.is_dir():
        pytest.skip(
            f"NO REAL AGENT TO RUN: {modules} is missing; install it with "
            "`npm ci --prefix tests/agents --ignore-scripts` (scripts/test.sh does)"
        )
    folder = tmp_path / "agent"
    folder.mkdir()
    model = AgentModel("codex", folder)
    yield model
    model.close()


def payload(event: Event) -> dict[str, Any]:
    """An event's payload, whichever type it is."""
    return dict(event["payload"])


async def expect(log: EventLog, what: str, predicate: Callable[[Event], bool]) -> Event:
    """The first event matching `predicate`, or a failure naming `what` and the events seen."""
    try:
        return await log.wait_for(predicate, AGENT_WAIT_S)
    except TimeoutError:
        seen = [(e["seq"], e["type"]) for e in log.stored]
        raise AssertionError(f"no {what} within {AGENT_WAIT_S} s; the client saw {seen}") from None


async def test_an_approval_answered_from_the_cli_while_a_client_watches(
    codex: AgentModel, home: Path, tmp_path: Path
) -> None:
    (home / "config.toml").write_text(
        codex.config_toml + '\n[daemon]\ndrain_grace_s = 1.0\n\n[approvals]\nmode = "manual"\n'
    )
    marker = f"drover-py-{uuid.uuid4().hex[:8]}"
    work = tmp_path / "work"
    work.mkdir()
    ran = work / "ran.txt"
    # The model asks Codex's shell tool to write the marker to a file (escalated, so Codex asks
    # first), then answers once it has seen the result.
    codex.push({"shell": f"echo {marker} > {ran}"})
    codex.push({"text": "the command ran"})
    daemon = Daemon(home).start()
    try:
        async with await Client.connect(home, reconnect_timeout=AGENT_WAIT_S, backoff_max=0.2) as client:
            session = await client.create_session(cwd=work, agent="codex")
            assert session.snapshot["info"].get("agent") == "codex", session.snapshot["info"]
            log = EventLog(session, after=0)
            receipt = await session.submit("run the command")
            admission_id = receipt["admission_id"]

            request = await expect(log, "approval.request", lambda e: e["type"] == "approval.request")
            prompt = payload(request)
            assert prompt["kind"] == "approval", prompt
            assert marker in prompt["command"], prompt
            assert not ran.exists(), "the command ran before it was approved"

            # The CLI answers it, another process than the one watching.
            answer = await asyncio.create_subprocess_exec(
                str(drover_bin()), "--home", str(home), "answer", session.id, "--choice", "once",
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            try:
                out, err = await asyncio.wait_for(answer.communicate(), AGENT_WAIT_S)
            finally:
                if answer.returncode is None:
                    answer.kill()
                    await answer.wait()
            assert answer.returncode == 0, (out, err)

            settled_approval = await expect(
                log, "approval.settled (the CLI's answer)", lambda e: e["type"] == "approval.settled"
            )
            completed_tool = await expect(
                log,
                "tool.complete of the approved command",
                lambda e: e["type"] == "tool.complete" and marker in json.dumps(e["payload"]),
            )
            settled = await expect(
                log,
                "turn.settled",
                lambda e: e["type"] == "turn.settled" and e["payload"]["admission_id"] == admission_id,
            )
            await log.close()

            assert payload(settled_approval)["prompt_id"] == prompt["prompt_id"], settled_approval
            assert payload(settled_approval)["choice"] == "once", settled_approval
            assert payload(settled)["outcome"] == "completed", settled
            # The answer reached the agent: the approved command ran, once.
            assert ran.read_text() == f"{marker}\n"
            stored = log.stored
            order = [stored.index(e) for e in (request, settled_approval, completed_tool, settled)]
            assert order == sorted(order), [(e["seq"], e["type"]) for e in stored]
            assert_no_gap_no_repeat(log.events)
            final = await session.receipt(admission_id, include_result=True)
            result = final.get("result")
            assert result is not None and result["final_response"] == "the command ran", final
    finally:
        daemon.stop()
