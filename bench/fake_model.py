#!/usr/bin/env python3
"""A loopback OpenAI-compatible fake model for bench/compare.sh (standard library only).

Answers at once, to Chat Completions (drover, Hermes) and the Responses API (Codex), streamed or
not. A request whose last user message contains TRIGGER ("printf X") and has no tool result after
it gets a call to the shell tool the client offers, running `printf X`; a request with that
result gets the text TOOL_OK; every other request the text FAKE_OK. GET /_stats says how many
requests came and how many tool results contained "X" (the driver checks each tool run with it).

usage: fake_model.py PORT
"""
import json
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ANSWER, TOOL_ANSWER, TRIGGER, COMMAND = "FAKE_OK", "TOOL_OK", "printf X", "printf X"
SHELL_TOOLS = ("terminal", "exec_command", "shell", "shell_command", "local_shell")
stats = {"posts": 0, "tool_results_with_x": 0}
lock = threading.Lock()


def text_of(content):
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else json.dumps(content)


def shell_call(tools):
    """(name, arguments) for the first shell-like tool offered, in the shape its schema asks."""
    by_name = {}
    for t in tools or []:
        by_name[t.get("name") or (t.get("function") or {}).get("name") or t.get("type")] = t
    for name in SHELL_TOOLS:
        if name in by_name:
            t = by_name[name]
            props = (t.get("parameters") or (t.get("function") or {}).get("parameters") or {}).get("properties") or {}
            if "cmd" in props:
                return name, {"cmd": COMMAND}
            if (props.get("command") or {}).get("type") == "array":
                return name, {"command": ["bash", "-lc", COMMAND]}
            return name, {"command": COMMAND}
    return None


def tool_state(items, is_user, is_result, result_text):
    """None: no trigger; True: call the tool; False: the result is there (counted)."""
    last = None
    for i, it in enumerate(items):
        if isinstance(it, dict) and is_user(it):
            last = i
    if last is None or TRIGGER not in text_of(items[last].get("content")):
        return None
    for it in items[last + 1:]:
        if isinstance(it, dict) and is_result(it):
            if "X" in result_text(it):
                with lock:
                    stats["tool_results_with_x"] += 1
            return False
    return True


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send_json(self, obj, code=200):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def start_stream(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def event(self, obj, name=None):
        head = b"event: " + name.encode() + b"\n" if name else b""
        data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        self.wfile.write(head + b"data: " + data + b"\n\n")
        self.wfile.flush()

    def do_GET(self):
        path = self.path.split("?")[0].rstrip("/")
        if path == "/_stats":
            with lock:
                return self.send_json(dict(stats))
        model = {"id": "fake-model", "object": "model", "created": 0, "owned_by": "fake",
                 "context_length": 131072, "max_model_len": 131072}
        if path == "/v1/models":
            return self.send_json({"object": "list", "data": [model]})
        if path.startswith("/v1/models/"):
            return self.send_json(model)
        return self.send_json({"error": {"message": "not found"}}, 404)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        with lock:
            stats["posts"] += 1
        path = self.path.split("?")[0].rstrip("/")
        if path.endswith("/chat/completions"):
            return self.chat(body)
        if path.endswith("/responses"):
            return self.resp_api(body)
        return self.send_json({"error": {"message": "not found"}}, 404)

    def chat(self, body):
        want = tool_state(body.get("messages") or [], lambda m: m.get("role") == "user",
                          lambda m: m.get("role") == "tool", lambda m: text_of(m.get("content")))
        call = shell_call(body.get("tools")) if want else None
        text = TOOL_ANSWER if want is False else ANSWER
        base = {"id": "chatcmpl-" + uuid.uuid4().hex[:12], "created": int(time.time()),
                "model": body.get("model") or "fake-model"}
        usage = {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
        if call:
            tc = {"id": "call_" + uuid.uuid4().hex[:12], "type": "function",
                  "function": {"name": call[0], "arguments": json.dumps(call[1])}}
            message, finish = {"role": "assistant", "content": None, "tool_calls": [tc]}, "tool_calls"
            delta = {"role": "assistant", "content": None, "tool_calls": [dict(tc, index=0)]}
        else:
            message, finish = {"role": "assistant", "content": text}, "stop"
            delta = {"role": "assistant", "content": text}
        if not body.get("stream"):
            return self.send_json(dict(base, object="chat.completion", usage=usage, choices=[
                {"index": 0, "message": message, "finish_reason": finish}]))
        self.start_stream()
        chunk = dict(base, object="chat.completion.chunk")
        self.event(dict(chunk, choices=[{"index": 0, "delta": delta, "finish_reason": None}]))
        self.event(dict(chunk, choices=[{"index": 0, "delta": {}, "finish_reason": finish}]))
        self.event(dict(chunk, choices=[], usage=usage))
        self.event(b"[DONE]")

    def resp_api(self, body):
        items = body.get("input") if isinstance(body.get("input"), list) else []
        want = tool_state(items, lambda i: i.get("role") == "user",
                          lambda i: i.get("type") in ("function_call_output", "custom_tool_call_output"),
                          lambda i: text_of(i.get("output")))
        call = shell_call(body.get("tools")) if want else None
        if call:
            item = {"type": "function_call", "id": "fc_" + uuid.uuid4().hex[:16],
                    "call_id": "call_" + uuid.uuid4().hex[:12], "name": call[0],
                    "arguments": json.dumps(call[1]), "status": "completed"}
        else:
            text = TOOL_ANSWER if want is False else ANSWER
            item = {"type": "message", "id": "msg_" + uuid.uuid4().hex[:16], "status": "completed",
                    "role": "assistant", "content": [{"type": "output_text", "text": text, "annotations": []}]}
        usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 3,
                 "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 13}
        resp = {"id": "resp_" + uuid.uuid4().hex[:16], "object": "response", "created_at": int(time.time()),
                "model": body.get("model") or "fake-model", "status": "in_progress", "output": [], "usage": None}
        done = dict(resp, status="completed", output=[item], usage=usage)
        if not body.get("stream"):
            return self.send_json(done)
        self.start_stream()
        seq = iter(range(1 << 30))
        for obj in ({"type": "response.created", "response": resp},
                    {"type": "response.output_item.added", "output_index": 0, "item": item},
                    {"type": "response.output_item.done", "output_index": 0, "item": item},
                    {"type": "response.completed", "response": done}):
            self.event(dict(obj, sequence_number=next(seq)), obj["type"])


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    server.daemon_threads = True
    print("listening on 127.0.0.1:%s" % sys.argv[1], flush=True)
    server.serve_forever()
