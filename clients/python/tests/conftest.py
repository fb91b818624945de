"""Fixtures: the real `drover` binary on a temporary home, and a loopback fake model.

The binary is `$DROVER_BIN`, else `<repo>/target/debug/drover` (built by `cargo build -p drover`
or `cargo test`). Every wait is bounded and every daemon is reaped at teardown.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fake_model import FakeModel

REPO = Path(__file__).resolve().parents[3]
#: The bound of every wait in these tests.
WAIT_S = 20.0


def drover_bin() -> Path:
    path = Path(os.environ.get("DROVER_BIN") or REPO / "target" / "debug" / "drover")
    if not path.is_file():
        pytest.fail(f"{path} does not exist: build it with `cargo build -p drover --bin drover`")
    return path


class Daemon:
    """A `drover daemon --home HOME` child process."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.proc: subprocess.Popen[bytes] | None = None
        self.info: dict[str, object] = {}

    def start(self) -> Daemon:
        assert self.proc is None, "already running"
        with open(self.home / "daemon-stderr.log", "ab") as stderr:
            self.proc = subprocess.Popen(
                [str(drover_bin()), "daemon", "--home", str(self.home)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            try:
                info = json.loads((self.home / "daemon.json").read_text())
                if info.get("pid") == self.proc.pid:
                    self.info = info
                    return self
            except (OSError, ValueError):
                pass
            code = self.proc.poll()
            if code is not None:
                self.proc = None
                log = (self.home / "daemon-stderr.log").read_text(errors="replace")
                raise RuntimeError(f"daemon exited early with {code}: {log[-2000:]}")
            time.sleep(0.02)
        self.kill()
        raise RuntimeError(f"daemon did not write daemon.json within {WAIT_S} s")

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=WAIT_S)
            self.proc = None

    def stop(self) -> None:
        """SIGTERM (graceful stop), SIGKILL if it has not exited in time; reaped either way."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=WAIT_S)
            self.proc = None


@pytest.fixture
def model() -> Iterator[FakeModel]:
    m = FakeModel()
    yield m
    m.close()


def write_config(home: Path, base_url: str, *, stream: bool = True) -> None:
    (home / "config.toml").write_text(
        "[model]\n"
        f'base_url = "{base_url}"\n'
        'name = "fake"\n'
        f"stream = {str(stream).lower()}\n"
        "max_retries = 0\n"
        "request_timeout_s = 30\n\n"
        "[daemon]\n"
        "drain_grace_s = 1.0\n\n"
        "[approvals]\n"
        'mode = "manual"\n'
    )


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"
    h.mkdir(mode=0o700)
    return h


@pytest.fixture
def daemon(home: Path, model: FakeModel) -> Iterator[Daemon]:
    write_config(home, model.base_url)
    d = Daemon(home).start()
    yield d
    d.stop()
