"""A scripted OpenAI-compatible chat server that answers like a Proposer (stdlib only).

Usage: fake_proposer_server.py REPLIES_JSON PORT_FILE
REPLIES_JSON holds a list of reply texts. POST /v1/chat/completions returns `n` choices, the next
n replies in order (cycling), so one `kz propose --n N` call gets replies 0..N-1. Listens on
127.0.0.1 at a port the OS picks and writes it to PORT_FILE (via a renamed temporary file, so a
poller never reads half a number). GET /stats: {"requests": R, "choices": C, "last_body": {...}}.
Used by curriculum/tests/propose_test.cpp; it is not a model.
"""
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
STATE = {"requests": 0, "choices": 0, "next": 0, "last_body": None}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    replies = []

    def log_message(self, *args):
        pass

    def send_json(self, code, payload):
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        with LOCK:
            stats = {k: STATE[k] for k in ("requests", "choices", "last_body")}
        self.send_json(200 if self.path == "/stats" else 404, stats)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if not self.path.endswith("/chat/completions"):
            self.send_json(404, {"error": {"message": "only /v1/chat/completions"}})
            return
        n = int(body.get("n", 1))
        with LOCK:
            start = STATE["next"]
            STATE.update(requests=STATE["requests"] + 1, choices=STATE["choices"] + n, next=start + n, last_body=body)
        texts = [self.replies[(start + i) % len(self.replies)] for i in range(n)]
        choices = [{"index": i, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}
                   for i, text in enumerate(texts)]
        self.send_json(200, {"id": "cmpl-proposer", "object": "chat.completion", "model": body.get("model"),
                             "choices": choices,
                             "usage": {"prompt_tokens": 100, "completion_tokens": 200 * n, "total_tokens": 0}})


def main():
    replies_path, port_file = sys.argv[1], sys.argv[2]
    with open(replies_path) as f:
        Handler.replies = json.load(f)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    tmp = port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(server.server_address[1]))
    os.replace(tmp, port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
