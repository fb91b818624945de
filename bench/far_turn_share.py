"""drover's own share of warm turns against a far endpoint, read from the kernel's clock.

Usage (needs `perf` and the right to trace syscalls system-wide: root, or
kernel.perf_event_paranoid at -1):
  PYTHONPATH=$PERF_ROOT/lib python3 bench/far_turn_share.py FAR_BASE CA_PEM TURNS DROVER_BIN [DROVER_BIN ...]

FAR_BASE is `../shared/bench/latency-proxy.py` (TLS, its CA in CA_PEM) in front of a loopback
model. For each build in turn: one daemon, one session, TURNS warm turns 0.3 s apart (after 3
warm-up turns), recorded with `perf record -a` on three syscall tracepoints only (`sendto`,
`recvfrom` returns, `writev`; cheap enough not to move the figures). Per turn:
  - submit -> request: the client's `prompt.submit` send to the worker's request write;
  - answer -> client: the proxy's send of the model's answer to the worker, to the client's
    read of `turn.settled`.
Their sum is what drover adds to the endpoint's round trip; it leaves out the proxy's own
delays, whose 1 ms timer granularity makes whole-turn figures of two builds differ by about
0.3 ms from run to run. Prints the medians per build. Needs `wsrpc.py` (the side-by-side
bench's WebSocket JSON-RPC client) beside this file or on PYTHONPATH. See docs/benchmarks.md.
"""
import json, os, re, shutil, signal, statistics, subprocess, sys, tempfile, time, uuid

sys.path.insert(0, os.path.dirname(__file__))

FAR, CA, TURNS, BINS = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
EVENTS = "syscalls:sys_enter_sendto,syscalls:sys_exit_recvfrom,syscalls:sys_enter_writev"
LINE = re.compile(r"^\s*(.+?)\s+(\d+)/(\d+)\s+\[\d+\]\s+(\d+\.\d+):\s+syscalls:(\S+):")


def drive(binary, out):
    """The child run under perf: one daemon, warm turns; writes their monotonic times."""
    import bench_daemon
    root = tempfile.mkdtemp(prefix="far-share-")
    env = dict(os.environ, OPENAI_API_KEY="dummy", SSL_CERT_FILE=CA)
    env.pop("SSL_CERT_DIR", None)
    p, c, sid = bench_daemon.start(binary, os.path.join(root, "home"), root, FAR, env)
    turns = []
    try:
        for i in range(TURNS + 3):
            time.sleep(0.3)
            t0 = time.monotonic()
            r = c.call("prompt.submit", {"session_id": sid, "input_id": str(uuid.uuid4()),
                                         "text": "say hi"})
            t1, outcome, _ = c.wait_settled(r["admission_id"])
            assert outcome == "completed", outcome
            if i >= 3:
                turns.append({"submit": t0, "settled": t1})
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(30)
        shutil.rmtree(root, ignore_errors=True)
    json.dump({"client": os.getpid(), "turns": turns}, open(out, "w"))


def share(meta, trace, proxy):
    events = []
    for line in trace.splitlines():
        m = LINE.match(line)
        if m:
            comm, pid, _, ts, event = m.groups()
            events.append((float(ts), comm.strip(), int(pid), event))
    events.sort()
    client, rows = meta["client"], []
    for t in meta["turns"]:
        w = [e for e in events if t["submit"] - 0.001 <= e[0] <= t["settled"] + 0.001]
        try:
            sub = next(e for e in w if e[2] == client and e[3] == "sys_enter_sendto")
            req = next(e for e in w if e[0] > sub[0] and e[1].startswith("drover-")
                       and e[3] == "sys_enter_writev")
            ans = next(e for e in w if e[0] > req[0] + 0.015 and e[2] == proxy
                       and e[3] == "sys_enter_sendto")
            got = [e for e in w if e[2] == client and e[3] == "sys_exit_recvfrom"
                   and e[0] <= t["settled"]][-1]
        except (StopIteration, IndexError):
            continue
        rows.append(((req[0] - sub[0]) * 1e3, (got[0] - ans[0]) * 1e3,
                     (t["settled"] - t["submit"]) * 1e3))
    return rows


def main():
    if os.environ.get("FAR_SHARE_DRIVE"):
        drive(BINS[0], os.environ["FAR_SHARE_DRIVE"])
        return
    port = FAR.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)[1]
    proxy = int(subprocess.run(["pgrep", "-f", "latency-proxy.py.*--listen %s" % port],
                               capture_output=True, text=True).stdout.split()[0])
    work = tempfile.mkdtemp(prefix="far-share-perf-")
    try:
        for binary in BINS:
            data, out = os.path.join(work, "perf.data"), os.path.join(work, "turns.json")
            env = dict(os.environ, FAR_SHARE_DRIVE=out)
            subprocess.run(["perf", "record", "-q", "-k", "mono", "-a", "-e", EVENTS,
                            "--exclude-perf", "-o", data, "--", sys.executable,
                            os.path.abspath(__file__)] + sys.argv[1:4] + [binary],
                           env=env, check=True, stdout=subprocess.DEVNULL)
            trace = subprocess.run(["perf", "script", "-i", data, "-F",
                                    "comm,pid,tid,cpu,time,event,trace"],
                                   capture_output=True, text=True).stdout
            rows = share(json.load(open(out)), trace, proxy)
            med = lambda j: statistics.median(r[j] for r in rows)
            print("%s: n=%d turn p50 %.2f ms | submit->request %.3f | answer->client %.3f "
                  "| drover's share %.3f ms" % (binary, len(rows), med(2), med(0), med(1),
                                                statistics.median(r[0] + r[1] for r in rows)))
    finally:
        shutil.rmtree(work, ignore_errors=True)


main()
