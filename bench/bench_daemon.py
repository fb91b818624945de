"""A drover daemon for the bench scripts: one home, one session, a WebSocket client.

`start(binary, home, cwd, base, env)` writes a config whose model is `base` (approvals `auto`),
starts `binary daemon --home home` with `env` (its output in `home.log`), waits (30 s at most)
for its `daemon.json`, connects with `wsrpc.SyncClient` (the side-by-side bench's client, on
PYTHONPATH or beside this file) and creates a session in `cwd` (outside the home, where the
tools may work). Returns the process, the client and the session id.
"""
import json, os, signal, subprocess, time, uuid

from wsrpc import SyncClient


def start(binary, home, cwd, base, env):
    os.makedirs(home, exist_ok=True)
    with open(os.path.join(home, "config.toml"), "w") as f:
        f.write('[model]\nbase_url = "%s"\nname = "anchor-model"\nstream = true\n'
                '[approvals]\nmode = "auto"\n' % base)
    out = open(home + ".log", "ab")
    p = subprocess.Popen([binary, "daemon", "--home", home], env=env, cwd=cwd,
                         stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
    try:
        end = time.time() + 30
        while True:
            try:
                info = json.load(open(os.path.join(home, "daemon.json")))
                if info.get("pid") == p.pid:
                    break
            except (OSError, ValueError):
                pass
            assert p.poll() is None and time.time() < end, "daemon did not start"
            time.sleep(0.01)
        c = SyncClient(info["url"], info["token"])
        sid = c.call("session.create", {"request_id": str(uuid.uuid4()), "cwd": cwd})["session_id"]
    except BaseException:
        # No daemon is left behind when it did not start or refused the session.
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        raise
    return p, c, sid
