"""A real local OpenAI-compatible HTTP server that replays a script of assistant turns, for proposer tests.

Each turn is either a list of tool calls `[{"name": ..., "arguments": {...}}]` or a final text. Every request
body received is kept in `requests`, so a test can assert what the client sent back (tool results).
"""
from __future__ import annotations

import itertools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ScriptedLLM:
    """`with ScriptedLLM(script) as llm:` serves the script at `llm.base_url` (…/v1)."""

    def __init__(self, script: list[list[dict[str, Any]] | str], model: str = "scripted") -> None:
        self.script = list(script)
        self.model = model
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, ending in /v1."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> "ScriptedLLM":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def reply(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """(status, JSON) for one chat-completions request: the next scripted turn."""
        with self._lock:
            self.requests.append(body)
            if not self.script:
                return 400, {"error": {"message": "the script is exhausted", "type": "invalid_request_error"}}
            turn = self.script.pop(0)
            number = next(self._ids)
        if isinstance(turn, str):
            message: dict[str, Any] = {"role": "assistant", "content": turn}
            finish = "stop"
        else:
            calls = [{"id": f"call_{number}_{i}", "type": "function",
                      "function": {"name": c["name"], "arguments": json.dumps(c.get("arguments", {}))}}
                     for i, c in enumerate(turn)]
            message = {"role": "assistant", "content": None, "tool_calls": calls}
            finish = "tool_calls"
        return 200, {
            "id": f"chatcmpl-{number}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", self.model),
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }


def _handler(llm: ScriptedLLM) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            if self.path.rstrip("/") != "/v1/chat/completions":
                status, reply = 404, {"error": {"message": f"no route {self.path}", "type": "not_found"}}
            else:
                try:
                    status, reply = llm.reply(json.loads(raw))
                except json.JSONDecodeError:
                    status, reply = 400, {"error": {"message": "the body is not JSON", "type": "invalid_request"}}
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet test output

    return Handler
