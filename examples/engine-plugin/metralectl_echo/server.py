"""The echo stand-in server: OpenAI-style /v1/models and /v1/chat/completions (the answer is the last user
message), /health and /metrics. Stdlib only. `python -m metralectl_echo.server --help` is the text pinned as
the engine's authority (data/engine/echo/1.0.0/help.txt)."""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HELP = """usage: echo-server MODEL [options]

--host HOST                             address to listen on (default: 127.0.0.1)
--port N                                port to listen on (default: 8000)
--served-name NAME                      the model name /v1/models reports (default: MODEL)
--max-tokens N                          longest answer, in words (default: 64)
-h,    --help                           print this help and exit
"""


def parse(argv: list[str]) -> dict[str, str]:
    if "-h" in argv or "--help" in argv:
        print(HELP, end="")
        raise SystemExit(0)
    if not argv or argv[0].startswith("-"):
        raise SystemExit("echo-server: the model comes first (echo-server MODEL [options])")
    opts = {"model": argv[0], "host": "127.0.0.1", "port": "8000", "max-tokens": "64"}
    rest = argv[1:]
    for key, value in zip(rest[::2], rest[1::2]):
        if key[2:] not in ("host", "port", "served-name", "max-tokens"):
            raise SystemExit(f"echo-server: unknown option {key}")
        opts[key[2:]] = value
    return opts


def main(argv: list[str]) -> None:
    opts = parse(argv)
    name = opts.get("served-name", opts["model"])
    served = {"n": 0}

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: object, kind: str = "application/json") -> None:
            data = (body if isinstance(body, str) else json.dumps(body)).encode()
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/health":
                self._send(200, {"status": "ok"})
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "echo"}]})
            elif self.path == "/metrics":
                self._send(200, f"echo_requests_total {served['n']}\n", "text/plain")
            else:
                self._send(404, {"error": {"message": "not found"}})

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            messages = body.get("messages") or [{"content": ""}]
            words = str(messages[-1].get("content", "")).split()[: int(opts["max-tokens"])]
            served["n"] += 1
            usage = {"prompt_tokens": len(words), "completion_tokens": len(words), "total_tokens": 2 * len(words)}
            if body.get("stream"):
                self._stream(words, usage)
                return
            self._send(200, {"id": "echo", "object": "chat.completion", "model": name,
                             "choices": [{"index": 0, "finish_reason": "stop",
                                          "message": {"role": "assistant", "content": " ".join(words)}}],
                             "usage": usage})

        def _stream(self, words: list[str], usage: dict[str, int]) -> None:
            """Server-sent events: one word a chunk, then the finish reason and the usage, then [DONE]."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            base = {"id": "echo", "object": "chat.completion.chunk", "model": name}
            chunks = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
            chunks += [{**base, "choices": [{"index": 0, "delta": {"content": (" " if i else "") + w}}]}
                       for i, w in enumerate(words)]
            chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": usage})
            for chunk in chunks:
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer((opts["host"], int(opts["port"])), Handler)
    print(f"echo-server: listening on http://{opts['host']}:{opts['port']}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
