"""A loopback, scriptable OpenAI-compatible model server for the tests.

Each `POST .../chat/completions` pops the next scripted `Reply` (FIFO), or answers `text("ok")`
when the script is empty. It answers in SSE when the request says `stream: true` (the text in
a few chunks, usage last, then `data: [DONE]`), else in one JSON body. A reply may be held by a
`threading.Event` gate until the test opens it.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: How long a gated reply waits before it answers anyway (so no handler thread outlives a test).
GATE_LIMIT_S = 30.0


@dataclass
class Reply:
    text: str = ""
    tool_calls: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    gate: threading.Event | None = None

    @staticmethod
    def say(text: str) -> Reply:
        return Reply(text=text)

    @staticmethod
    def call(call_id: str, name: str, args: dict[str, Any]) -> Reply:
        return Reply(tool_calls=[(call_id, name, args)])

    def gated(self, gate: threading.Event) -> Reply:
        self.gate = gate
        return self


class FakeModel:
    def __init__(self) -> None:
        self._script: list[Reply] = []
        self._lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        #: Set whenever a request arrives (tests wait on it with a timeout).
        self.arrived = threading.Condition(self._lock)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def push(self, reply: Reply) -> None:
        with self._lock:
            self._script.append(reply)

    def wait_requests(self, count: int, timeout: float) -> bool:
        """Waits until at least `count` requests arrived."""
        with self.arrived:
            return self.arrived.wait_for(lambda: len(self.requests) >= count, timeout)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def _next(self, body: dict[str, Any]) -> Reply:
        with self.arrived:
            self.requests.append(body)
            self.arrived.notify_all()
            return self._script.pop(0) if self._script else Reply.say("ok")

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        model = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                reply = model._next(body)
                if reply.gate is not None:
                    reply.gate.wait(GATE_LIMIT_S)
                try:
                    if body.get("stream"):
                        self._stream(reply)
                    else:
                        self._json(reply)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the worker (or the whole daemon) was killed meanwhile

            def _json(self, reply: Reply) -> None:
                message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
                if reply.tool_calls:
                    message["tool_calls"] = [
                        {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
                        for i, n, a in reply.tool_calls
                    ]
                data = json.dumps({
                    "id": "chatcmpl-fake",
                    "object": "chat.completion",
                    "choices": [{"index": 0, "message": message, "finish_reason": _finish(reply)}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                }).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, reply: Reply) -> None:
                def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
                    c = {"id": "chatcmpl-fake", "object": "chat.completion.chunk",
                         "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
                    return f"data: {json.dumps(c)}\n\n".encode()

                parts = [chunk({"role": "assistant", "content": ""})]
                text = reply.text
                step = max(1, len(text) // 3)
                parts += [chunk({"content": text[i:i + step]}) for i in range(0, len(text), step)]
                for index, (i, n, a) in enumerate(reply.tool_calls):
                    parts.append(chunk({"tool_calls": [{"index": index, "id": i, "type": "function",
                                                        "function": {"name": n, "arguments": json.dumps(a)}}]}))
                parts.append(chunk({}, _finish(reply)))
                usage = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "choices": [],
                         "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}
                parts.append(f"data: {json.dumps(usage)}\n\n".encode())
                parts.append(b"data: [DONE]\n\n")
                data = b"".join(parts)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler


def _finish(reply: Reply) -> str:
    return "tool_calls" if reply.tool_calls else "stop"
