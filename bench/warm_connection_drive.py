"""Warm-turn p50 of drover binaries against a far TLS endpoint (latency-proxy.py in front of model.py).

Usage: python3 bench/warm_connection_drive.py BASE_URL CA_PEM TURNS BIN[::EXTRA_TOML] ...
One daemon per binary (EXTRA_TOML: `[model]` lines separated by `;`), the binaries alternating
turn by turn, 3 warm-up turns, 0.3 s between turns. Needs `wsrpc.py` (the side-by-side bench's
WebSocket JSON-RPC client) beside it or on PYTHONPATH. See docs/benchmarks.md.
"""
import json, os, shutil, signal, statistics, subprocess, sys, time, uuid
sys.path.insert(0, os.path.dirname(__file__))
from wsrpc import SyncClient

BASE = sys.argv[1]; CA = sys.argv[2]; TURNS = int(sys.argv[3]); bins = sys.argv[4:]
ROOT = "/tmp/warmbench/run"; os.makedirs(ROOT, exist_ok=True)
ENV = dict(os.environ, OPENAI_API_KEY="dummy", SSL_CERT_FILE=CA); ENV.pop("SSL_CERT_DIR", None)

def daemon(name, spec):
    exe, _, extra = spec.partition("::")
    home = os.path.join(ROOT, name); shutil.rmtree(home, ignore_errors=True); os.makedirs(home)
    with open(os.path.join(home, "config.toml"), "w") as f:
        f.write('[model]\nbase_url = "%s"\nname = "anchor-model"\nstream = true\n%s\n[approvals]\nmode = "auto"\n' % (BASE, extra.replace(";", "\n")))
    log = open(home + ".log", "ab")
    p = subprocess.Popen([exe, "daemon", "--home", home], env=ENV, cwd=ROOT, stdin=subprocess.DEVNULL,
                         stdout=log, stderr=log, start_new_session=True)
    end = time.time() + 30
    while True:
        try:
            info = json.load(open(os.path.join(home, "daemon.json")))
            if info.get("pid") == p.pid: break
        except (OSError, ValueError): pass
        assert p.poll() is None and time.time() < end, "daemon did not start"
        time.sleep(0.01)
    c = SyncClient(info["url"], info["token"])
    sid = c.call("session.create", {"request_id": str(uuid.uuid4()), "cwd": ROOT})["session_id"]
    return p, c, sid

def turn(c, sid):
    t0 = time.perf_counter()
    r = c.call("prompt.submit", {"session_id": sid, "input_id": str(uuid.uuid4()), "text": "say hi"})
    _, outcome, _ = c.wait_settled(r["admission_id"])
    assert outcome == "completed", outcome
    return (time.perf_counter() - t0) * 1000

ds = []
lat = [[] for _ in bins]
try:
    for i, b in enumerate(bins):
        ds.append(daemon("d%d" % i, b))
    for i in range(TURNS + 3):
        for k, (p, c, sid) in enumerate(ds):
            time.sleep(0.3)  # a person's pause: the spare is ready and waiting, as between prompts
            ms = turn(c, sid)
            if i >= 3: lat[k].append(ms)
finally:
    for p, c, sid in ds:
        if p.poll() is None: p.send_signal(signal.SIGTERM)
for (p, c, sid), b, l in zip(ds, bins, lat):
    p.wait(30)
    l.sort()
    print("%s: n=%d p50 %.1f ms p90 %.1f min %.1f max %.1f" % (b, len(l), statistics.median(l), l[int(len(l) * 0.9)], l[0], l[-1]))
