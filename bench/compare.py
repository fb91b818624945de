#!/usr/bin/env python3
"""The measuring half of bench/compare.sh (which installs the peers, starts the fake model and
sets the environment below). Prints issue 15's table: drover, Codex, Hermes, drover/Codex.

Every system talks to the same loopback fake model (bench/fake_model.py) and runs with a clean
environment of its own. The systems alternate run by run (the order rotates every round), so a
drift of the machine's load touches all of them alike. Nothing is asserted about speed; a run
whose answer is not the fake model's (or whose tool did not print X) fails the whole script.

Environment: RUN_DIR, BASE_URL, DROVER_BIN, CODEX_BIN, HERMES_BIN (set by compare.sh); ROUNDS (9),
WARM_TURNS (50), WARM_WARMUP (5).
"""
import asyncio
import http.client
import json
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

from drover_client import Client

RUN = os.environ["RUN_DIR"]
BASE = os.environ["BASE_URL"]
DROVER, CODEX, HERMES = os.environ["DROVER_BIN"], os.environ["CODEX_BIN"], os.environ["HERMES_BIN"]
ROUNDS = int(os.environ.get("ROUNDS", "9"))
WARM_TURNS = int(os.environ.get("WARM_TURNS", "50"))
WARM_WARMUP = int(os.environ.get("WARM_WARMUP", "5"))
WORK = os.path.join(RUN, "work")
TICKS = os.sysconf("SC_CLK_TCK")
HI, TOOL = "say hi", "run printf X"   # fake_model.py answers the second with a shell tool call

BASE_ENV = {"HOME": os.path.join(RUN, "home"), "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8", "TERM": "dumb"}
CODEX_ENV = dict(BASE_ENV, CODEX_HOME=os.path.join(RUN, "codex-home"), FAKE_API_KEY="dummy")
HERMES_ENV = dict(BASE_ENV, HERMES_HOME=os.path.join(RUN, "hermes-home"))
DROVER_ENV = dict(BASE_ENV, OPENAI_API_KEY="dummy")


def log(*a):
    print("[%s]" % time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


def model_stats():
    with urllib.request.urlopen(BASE.rsplit("/v1", 1)[0] + "/_stats", timeout=10) as r:
        return json.load(r)


def proc_cpu(pid):
    """CPU seconds of pid and of the children it has reaped (utime+stime+cutime+cstime)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / TICKS


def rss_mib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def comm(pid):
    try:
        with open("/proc/%s/comm" % pid) as f:
            return f.read().strip()
    except OSError:
        return None


def all_children(pid):
    kids = []
    for task in os.listdir("/proc/%d/task" % pid):
        with open("/proc/%d/task/%s/children" % (pid, task)) as f:
            kids += f.read().split()
    return kids


def children(pid):
    """The processes `pid` started that serve a turn: drover's spare worker, waiting for the
    next turn under the name `drover-spare`, and its worker template (`drover-template`,
    which forks the spares) are always there and are not among them."""
    return [k for k in all_children(pid) if comm(k) not in ("drover-spare", "drover-template")]


def drover_cpu(pid):
    """CPU seconds of the drover daemon `pid`, of the workers it reaped, and of its live
    worker template (reaped only when the daemon stops, so not in the daemon's own count)."""
    total = proc_cpu(pid)
    for kid in all_children(pid):
        if comm(kid) == "drover-template":
            with open("/proc/%s/stat" % kid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:13]) / TICKS
    return total


def wait_until(cond, what, timeout=60.0):
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise RuntimeError("timed out waiting for " + what)
        time.sleep(0.01)


def timed(argv, env, out_name):
    """Runs argv to its end; (wall seconds from spawn to exit, stdout)."""
    with open(os.path.join(RUN, out_name + ".err"), "wb") as err:
        t0 = time.perf_counter()
        p = subprocess.run(argv, env=env, cwd=WORK, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=err, timeout=300)
        wall = time.perf_counter() - t0
    out = p.stdout.decode(errors="replace")
    if p.returncode != 0:
        raise RuntimeError("%s exited %d: %s (stderr in %s.err)" % (argv[:3], p.returncode, out[-300:], out_name))
    return wall, out


def drover_home(name):
    home = os.path.join(RUN, name)
    os.makedirs(home, exist_ok=True)
    with open(os.path.join(home, "config.toml"), "w") as f:
        f.write('[model]\nbase_url = "%s"\nname = "fake-model"\nstream = true\n' % BASE)
    return home


class DroverDaemon:
    """`drover daemon --home H` in the foreground, a child of this script."""

    def __init__(self, home):
        self.home = home
        self.p = subprocess.Popen([DROVER, "--home", home, "daemon"], env=DROVER_ENV, cwd=WORK,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=open(os.path.join(RUN, "drover-daemon.err"), "ab"))
        self.pid = self.p.pid

        def ready():
            try:
                with open(os.path.join(home, "daemon.json")) as f:
                    return json.load(f)["pid"] == self.pid
            except (OSError, ValueError, KeyError):
                return False
        wait_until(ready, "drover daemon.json")

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        self.p.wait(60)


def drover_run(home, prompt, name):
    return timed([DROVER, "--home", home, "run", prompt], DROVER_ENV, name)


def drover_cold(home, prompt, name):
    """`drover run` with no daemon: it starts one. Stopped afterwards, outside the timing."""
    if os.path.exists(os.path.join(home, "daemon.json")):
        raise RuntimeError("a daemon still runs on " + home)
    wall, out = drover_run(home, prompt, name)
    with open(os.path.join(home, "daemon.json")) as f:
        pid = json.load(f)["pid"]
    subprocess.run([DROVER, "--home", home, "stop"], env=DROVER_ENV, cwd=WORK, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=90)
    wait_until(lambda: not os.path.exists("/proc/%d" % pid) or open("/proc/%d/stat" % pid).read()
               .rsplit(")", 1)[1].split()[0] == "Z", "the started daemon to exit")
    return wall, out


def oneshot(prompt, expect, check_tool):
    """One prompt as a whole process per system, ROUNDS counted rounds after a warm-up."""
    warm_home = drover_home("oneshot-warm-" + prompt.replace(" ", "-"))
    cold_home = drover_home("oneshot-cold-" + prompt.replace(" ", "-"))
    daemon = DroverDaemon(warm_home)
    codex_flags = ["--dangerously-bypass-approvals-and-sandbox"] if check_tool else []
    systems = {
        "codex": lambda n: timed([CODEX, "exec", "--skip-git-repo-check"] + codex_flags + [prompt], CODEX_ENV, n),
        "hermes": lambda n: timed([HERMES, "-z", prompt], HERMES_ENV, n),
        "drover, daemon running": lambda n: drover_run(warm_home, prompt, n),
    }
    if not check_tool:
        systems["drover, no daemon"] = lambda n: drover_cold(cold_home, prompt, n)
    walls = {k: [] for k in systems}
    names = list(systems)
    try:
        for rnd in range(ROUNDS + 1):
            for name in names[rnd % len(names):] + names[:rnd % len(names)]:
                before = model_stats()["tool_results_with_x"]
                wall, out = systems[name]("%s-%s-%d" % (prompt.split()[0], name.split(",")[0], rnd))
                if expect not in out:
                    raise RuntimeError("%s answered %r, not %s" % (name, out[-300:], expect))
                if check_tool and model_stats()["tool_results_with_x"] <= before:
                    raise RuntimeError("%s: no tool result with X reached the model" % name)
                if rnd > 0:
                    walls[name].append(wall)
            log("%s round %d done" % (prompt, rnd))
    finally:
        daemon.stop()
    return walls


class CodexAppServer:
    """`codex app-server`: JSON-RPC lines on stdin/stdout, one thread, one turn at a time."""

    def __init__(self):
        self.p = subprocess.Popen([CODEX, "app-server"], env=CODEX_ENV, cwd=WORK, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=open(os.path.join(RUN, "codex-app-server.err"), "ab"))
        self.pid, self.id = self.p.pid, 0
        self.request("initialize", {"clientInfo": {"name": "drover-compare", "version": "0"}})
        self.send({"jsonrpc": "2.0", "method": "initialized"})
        self.thread = self.request("thread/start", {"cwd": WORK, "ephemeral": True})["thread"]["id"]

    def send(self, obj):
        self.p.stdin.write((json.dumps(obj) + "\n").encode())
        self.p.stdin.flush()

    def read(self):
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError("codex app-server closed its stdout")
        return json.loads(line)

    def request(self, method, params):
        self.id += 1
        self.send({"jsonrpc": "2.0", "id": self.id, "method": method, "params": params})
        while True:
            m = self.read()
            if m.get("id") == self.id and "method" not in m:
                if "error" in m:
                    raise RuntimeError("codex %s: %s" % (method, m["error"]))
                return m["result"]

    def turn(self, text):
        self.id += 1
        self.send({"jsonrpc": "2.0", "id": self.id, "method": "turn/start",
                   "params": {"threadId": self.thread, "input": [{"type": "text", "text": text}]}})
        answer = None
        while True:
            m = self.read()
            params = m.get("params") or {}
            if m.get("method") == "item/completed" and (params.get("item") or {}).get("type") == "agentMessage":
                answer = params["item"].get("text")
            elif m.get("method") == "turn/completed":
                return answer

    def stop(self):
        self.p.stdin.close()
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


class HermesGateway:
    """`hermes gateway run` with its OpenAI-compatible API server on a free loopback port."""

    def __init__(self):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        self.key = secrets.token_hex(16)
        env = dict(HERMES_ENV, API_SERVER_ENABLED="1", API_SERVER_KEY=self.key,
                   API_SERVER_PORT=str(self.port), API_SERVER_HOST="127.0.0.1")
        self.p = subprocess.Popen([HERMES, "gateway", "run"], env=env, cwd=WORK, stdin=subprocess.DEVNULL,
                                  stdout=open(os.path.join(RUN, "hermes-gateway.log"), "ab"), stderr=subprocess.STDOUT,
                                  start_new_session=True)
        self.pid = self.p.pid

        def healthy():
            if self.p.poll() is not None:
                raise RuntimeError("hermes gateway exited %s (see hermes-gateway.log)" % self.p.returncode)
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                c.request("GET", "/health")
                return c.getresponse().status == 200
            except OSError:
                return False
        wait_until(healthy, "the hermes gateway", timeout=120)
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)

    def turn(self, text):
        body = json.dumps({"model": "fake-model", "messages": [{"role": "user", "content": text}]})
        self.conn.request("POST", "/v1/chat/completions", body=body,
                          headers={"Authorization": "Bearer " + self.key, "Content-Type": "application/json"})
        data = json.loads(self.conn.getresponse().read())
        return data["choices"][0]["message"]["content"]

    def stop(self):
        self.conn.close()
        os.killpg(self.pid, signal.SIGTERM)
        try:
            self.p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.pid, signal.SIGKILL)
            self.p.wait()


async def warm():
    """Warm daemon turns: each system's long-running process, one conversation, WARM_TURNS turns
    (after WARM_WARMUP) round-robin; CPU of each process (and its reaped children) per turn."""
    home = drover_home("warm-drover")
    daemon = DroverDaemon(home)
    codex, hermes = CodexAppServer(), None
    try:
        hermes = HermesGateway()
        time.sleep(2)  # the same settling time for all three before the first reading
        pids = {"drover": daemon.pid, "codex": codex.pid, "hermes": hermes.pid}
        rss_start = {k: rss_mib(p) for k, p in pids.items()}
        client = await Client.connect(home)
        session = await client.create_session(cwd=WORK)
        events = session.events()

        async def drover_turn(text):
            receipt = await session.submit(text)
            answer = None
            async for e in events:
                if e["type"] == "message.complete":
                    answer = e["payload"].get("text")
                if e["type"] == "turn.settled" and e["payload"]["admission_id"] == receipt["admission_id"]:
                    return answer if e["payload"]["outcome"] == "completed" else None

        turn = {"drover": drover_turn, "codex": codex.turn, "hermes": hermes.turn}
        names = list(turn)
        lat = {k: [] for k in names}
        for rnd in range(WARM_WARMUP + WARM_TURNS):
            if rnd == WARM_WARMUP:
                wait_until(lambda: not children(daemon.pid), "drover's workers to be reaped")
                cpu0 = {k: drover_cpu(p) if k == "drover" else proc_cpu(p) for k, p in pids.items()}
            for name in names[rnd % 3:] + names[:rnd % 3]:
                t0 = time.perf_counter()
                answer = turn[name](HI)
                if asyncio.iscoroutine(answer):
                    answer = await answer
                elapsed = time.perf_counter() - t0
                if answer is None or "FAKE_OK" not in answer:
                    raise RuntimeError("%s warm turn answered %r" % (name, answer))
                if rnd >= WARM_WARMUP:
                    lat[name].append(elapsed * 1000.0)
        wait_until(lambda: not children(daemon.pid), "drover's workers to be reaped")
        cpu = {k: ((drover_cpu(p) if k == "drover" else proc_cpu(p)) - cpu0[k]) * 1000.0 / WARM_TURNS
               for k, p in pids.items()}
        rss_after = {k: rss_mib(p) for k, p in pids.items()}
        await client.close()
    finally:
        codex.stop()
        if hermes:
            hermes.stop()
        daemon.stop()
    return lat, cpu, rss_start, rss_after


def pct(values, p):
    v = sorted(values)
    return v[max(1, min(len(v), -(-p * len(v) // 100))) - 1]


def main():
    os.makedirs(WORK, exist_ok=True)
    log("one-shot: say hi")
    hi = oneshot(HI, "FAKE_OK", check_tool=False)
    log("one tool call: printf X")
    tool = oneshot(TOOL, "TOOL_OK", check_tool=True)
    log("warm turns")
    lat, cpu, rss0, rss1 = asyncio.run(warm())

    med = lambda v: statistics.median(v)
    rows = []

    def row(label, c, h, d, unit, fmt="%.3f"):
        cell = lambda x: (fmt % x) + unit if isinstance(x, float) else x
        ratio = "%.3f" % (d[0] / c[0]) if isinstance(d, tuple) else "%.3f" % (d / c)
        dv = (fmt % d[0] + " / " + fmt % d[1] + unit) if isinstance(d, tuple) else cell(d)
        cv = (fmt % c[0] + " / " + fmt % c[1] + unit) if isinstance(c, tuple) else cell(c)
        hv = (fmt % h[0] + " / " + fmt % h[1] + unit) if isinstance(h, tuple) else cell(h)
        if isinstance(d, tuple):
            ratio = "%.2f / %.2f" % (d[0] / c[0], d[1] / c[1])
        rows.append("| %s | %s | %s | %s | %s |" % (label, cv, hv, dv, ratio))

    row("one-shot `say hi`, wall, daemon running", med(hi["codex"]), med(hi["hermes"]),
        med(hi["drover, daemon running"]), " s")
    row("one-shot, wall, no daemon running (`drover run` starts it)", med(hi["codex"]), med(hi["hermes"]),
        med(hi["drover, no daemon"]), " s")
    row("one tool call (`printf X`), wall, daemon running", med(tool["codex"]), med(tool["hermes"]),
        med(tool["drover, daemon running"]), " s")
    row("warm daemon turn, submit to done, p50 / p99", (pct(lat["codex"], 50), pct(lat["codex"], 99)),
        (pct(lat["hermes"], 50), pct(lat["hermes"], 99)), (pct(lat["drover"], 50), pct(lat["drover"], 99)),
        " ms", "%.1f")
    row("CPU per warm turn", cpu["codex"], cpu["hermes"], cpu["drover"], " ms", "%.1f")
    row("daemon RSS after start / after %d turns" % (WARM_WARMUP + WARM_TURNS),
        (rss0["codex"], rss1["codex"]), (rss0["hermes"], rss1["hermes"]), (rss0["drover"], rss1["drover"]),
        " MiB", "%.1f")
    print("%d counted one-shot runs of each after a warm-up; %d warm turns after %d; medians."
          % (ROUNDS, WARM_TURNS, WARM_WARMUP))
    print()
    print("| figure | Codex | Hermes | drover | drover/Codex |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))
    print()
    print("runs (s): " + json.dumps({k: [round(x, 4) for x in v] for k, v in hi.items()}))
    print("tool runs (s): " + json.dumps({k: [round(x, 4) for x in v] for k, v in tool.items()}))


if __name__ == "__main__":
    main()
