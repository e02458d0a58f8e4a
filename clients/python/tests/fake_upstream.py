"""OpenAI-compatible fake upstreams for the tests: one HTTP server per
upstream on a loopback port, whose behaviour a test switches at run time.

Modes: ``healthy`` (a complete answer, finish_reason ``stop``),
``truncated`` (HTTP 200, a few tokens, finish_reason ``length``: the silent
failure Hermes exists for), ``down`` (HTTP 500), ``slow`` (a complete
answer after ``slow_s``). Streaming requests get server-sent events with
the same content.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# A complete answer of ~120 tokens (Hermes counts a success under
# engine.short_output_tokens, 50 by default, as a short answer).
FULL = " ".join(["The quick brown fox jumps over the lazy dog, and then it rests in the sun for a while."] * 6)
SHORT = "The"


class FakeUpstream:
    def __init__(self, name: str, port: int = 0, slow_s: float = 4.0):
        self.name = name
        self.slow_s = slow_s
        self.mode = "healthy"
        self.lock = threading.Lock()
        self.served = 0
        self.served_by_mode: dict[str, int] = {}
        self.first_bad_at: float | None = None
        #: (wall time, mode) of every request served.
        self.log: list[tuple[float, str]] = []
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                mode = upstream.count()
                if mode == "down":
                    payload = json.dumps({"error": {"message": "upstream down", "type": "server_error"}}).encode()
                    self.send_response(500)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                if mode == "slow":
                    time.sleep(upstream.slow_s)
                text, finish = (SHORT, "length") if mode == "truncated" else (FULL, "stop")
                words = len(text.split())
                usage = {"prompt_tokens": 12, "completion_tokens": words, "total_tokens": 12 + words}
                model = body.get("model", "fake")
                if body.get("stream"):
                    self.send_response(200)
                    self.send_header("content-type", "text/event-stream")
                    self.send_header("connection", "close")
                    self.end_headers()
                    for i, word in enumerate(text.split(" ")):
                        chunk = {"id": "c", "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
                                 "choices": [{"index": 0, "delta": {"content": (" " if i else "") + word}, "finish_reason": None}]}
                        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    last = {"id": "c", "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
                            "choices": [{"index": 0, "delta": {}, "finish_reason": finish}], "usage": usage}
                    self.wfile.write(f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode())
                    self.wfile.flush()
                    self.close_connection = True
                    return
                payload = json.dumps({
                    "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()), "model": model,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
                    "usage": usage,
                }).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def count(self) -> str:
        with self.lock:
            mode = self.mode
            self.served += 1
            self.served_by_mode[mode] = self.served_by_mode.get(mode, 0) + 1
            self.log.append((time.time(), mode))
            if mode != "healthy" and self.first_bad_at is None:
                self.first_bad_at = time.time()
            return mode

    def served_between(self, t0: float, t1: float) -> int:
        with self.lock:
            return sum(1 for t, _ in self.log if t0 <= t < t1)

    def set(self, mode: str) -> None:
        with self.lock:
            self.mode = mode

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
