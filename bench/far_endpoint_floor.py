"""What a warm turn against a far endpoint costs beyond the network: drover beside a bare client.

Usage: python3 bench/far_endpoint_floor.py DROVER_BIN FAR_BASE LOOPBACK_BASE CA_PEM MODEL_LOG TURNS

FAR_BASE is `../shared/bench/latency-proxy.py` (TLS, its CA in CA_PEM) in front of the side-by-side
script's fake model (`model.py`, whose request log is MODEL_LOG); LOOPBACK_BASE is that model
itself. Four systems, interleaved turn by turn, 0.3 s between turns, 3 warm-up turns each:
  - a bare client (Python, a socket opened and TLS-connected before the clock starts, as a spare's
    warm connection) that posts a streaming chat request and reads to `[DONE]`: the floor of the
    endpoint and of the proxy;
  - drover (one daemon per endpoint, one session each), `prompt.submit` to `turn.settled`.
Per system: total p50/p90, and, on the model log's clock (the same machine), from the send (or
the submit) to the request's arrival and from the answer's end to the client having it.
A second table: the bare client alone, with and without another process opening a TLS
connection to the endpoint as it sends (what the next spare's warm connection does during a
drover turn).
Needs `wsrpc.py` (the side-by-side bench's WebSocket JSON-RPC client) beside this file or on
PYTHONPATH. See docs/benchmarks.md.
"""
import json, os, shutil, signal, socket, ssl, statistics, subprocess, sys, time, uuid
from urllib.parse import urlparse

sys.path.insert(0, os.path.dirname(__file__))
import bench_daemon

BIN, FAR, LOOP, CA, MLOG, TURNS = sys.argv[1:6] + [int(sys.argv[6])]
ROOT = "/tmp/far-endpoint-floor"
os.makedirs(ROOT, exist_ok=True)
ENV = dict(os.environ, OPENAI_API_KEY="dummy", SSL_CERT_FILE=CA)
ENV.pop("SSL_CERT_DIR", None)
BODY = json.dumps({"model": "anchor-model", "stream": True, "messages": [
    {"role": "system", "content": "x" * 9000}, {"role": "user", "content": "say hi"}]}).encode()


def log_size():
    try:
        return os.path.getsize(MLOG)
    except OSError:
        return 0


def posts_since(offset):
    with open(MLOG) as f:
        f.seek(offset)
        return [e for e in map(json.loads, filter(str.strip, f)) if e.get("method") == "POST"]


def daemon(name, base):
    home = os.path.join(ROOT, name)
    shutil.rmtree(home, ignore_errors=True)
    return bench_daemon.start(BIN, home, ROOT, base, ENV)


def drover_turn(c, sid):
    offset = log_size()
    u0, t0 = time.time(), time.perf_counter()
    r = c.call("prompt.submit", {"session_id": sid, "input_id": str(uuid.uuid4()), "text": "say hi"})
    t1, outcome, _ = c.wait_settled(r["admission_id"])
    assert outcome == "completed", outcome
    end = time.time() + 2
    while not (posts := posts_since(offset)) and time.time() < end:
        time.sleep(0.005)  # the model logs a request after its last byte
    return (t1 - t0) * 1e3, (posts[0]["t"] - u0) * 1e3, (u0 + t1 - t0 - posts[-1]["t_end"]) * 1e3


def bare_client(base):
    """Connects (TCP, TLS) now; the returned call sends one request and reads to [DONE]."""
    u = urlparse(base)
    s = socket.create_connection((u.hostname, u.port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if u.scheme == "https":
        s = ssl.create_default_context(cafile=CA).wrap_socket(s, server_hostname=u.hostname)
    request = ("POST %s/chat/completions HTTP/1.1\r\nHost: %s:%d\r\ncontent-type: application/json\r\n"
               "content-length: %d\r\n\r\n" % (u.path, u.hostname, u.port, len(BODY))).encode() + BODY

    def send(opener=None):
        offset = log_size()
        u0, t0 = time.time(), time.perf_counter()
        s.sendall(request)
        if opener:
            opener.stdin.write(b"open\n")
            opener.stdin.flush()
        data = b""
        while b"[DONE]" not in data:
            chunk = s.recv(65536)
            assert chunk, data
            data += chunk
        t1 = time.perf_counter()
        s.close()
        if opener:
            opener.stdin.write(b"close\n")
            opener.stdin.flush()
            assert opener.stdout.readline() == b"closed\n"
        time.sleep(0.03)  # the model's log line is written after its last byte
        post = posts_since(offset)[-1]
        return (t1 - t0) * 1e3, (post["t"] - u0) * 1e3, (u0 + t1 - t0 - post["t_end"]) * 1e3
    return send


def table(results):
    for name, rows in results.items():
        total = sorted(r[0] for r in rows)
        med = lambda j: statistics.median(r[j] for r in rows)
        print("%-34s n=%d total p50 %5.1f p90 %5.1f | send->request arrives %5.2f | answer sent->client has it %5.2f"
              % (name, len(rows), med(0), total[int(len(total) * 0.9)], med(1), med(2)))


daemons = {"far": daemon("far", FAR), "loopback": daemon("loopback", LOOP)}
systems = ["bare client, far endpoint", "drover, far endpoint", "bare client, loopback", "drover, loopback"]
results = {name: [] for name in systems}
try:
    for i in range(TURNS + 3):
        for name in systems:
            base, where = (FAR, "far") if "far" in name else (LOOP, "loopback")
            send = bare_client(base) if name.startswith("bare") else None
            time.sleep(0.3)  # a person's pause: the next spare is up and connected
            row = send() if send else drover_turn(*daemons[where][1:])
            if i >= 3:
                results[name].append(row)
finally:
    for p, _, _ in daemons.values():
        p.send_signal(signal.SIGTERM)
    for p, _, _ in daemons.values():
        p.wait(30)
table(results)

# Another process opens a connection (TCP and TLS, as a spare does) when told, while the bare
# client's request is under way, and closes it after.
OPENER = """
import socket, ssl, sys
host, port, ca = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ctx = ssl.create_default_context(cafile=ca)
for line in sys.stdin:
    s = ctx.wrap_socket(socket.create_connection((host, port)), server_hostname=host)
    sys.stdin.readline()
    s.close()
    print("closed", flush=True)
"""
far = urlparse(FAR)
opener = subprocess.Popen([sys.executable, "-c", OPENER, far.hostname, str(far.port), CA],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE)
concurrent = {"bare client, far endpoint": [], "the same, another TLS connection opened": []}
try:
    for i in range(TURNS + 3):
        for name in concurrent:
            send = bare_client(FAR)
            time.sleep(0.3)
            row = send(opener if name.startswith("the same") else None)
            if i >= 3:
                concurrent[name].append(row)
finally:
    opener.stdin.close()
    opener.wait(10)
table(concurrent)
print("load", " ".join(open("/proc/loadavg").read().split()[:3]))
