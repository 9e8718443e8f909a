"""A scripted OpenAI-compatible server for the HTTP generator tests (stdlib only).

Usage: fake_openai_server.py PORT_FILE [AUTH_TOKEN]
Listens on 127.0.0.1, port chosen by the OS, and writes that port to PORT_FILE (atomically:
written to a temporary sibling, then renamed, so a poller never reads half a number).

POST /v1/chat/completions and /v1/completions behave according to the model name, unless the
prompt text (the last message, or `prompt`) starts with "[mode:NAME]", which then wins (so one
batch can mix behaviours):
  echo          the last message / prompt as content; n choices; usage; logprobs when asked
  slow-N        sleeps N seconds, then echo
  fail-K        HTTP 500 for the first K attempts of a request, then echo
  ratelimit     HTTP 429 with Retry-After: 1 on the first attempt, then echo
  truncated     first attempt: HTTP 200 whose body is cut mid-JSON, then echo
  bad-request   HTTP 400
  one-choice    echo, but ignores n (always 1 choice)
  auth          HTTP 401 unless "Authorization: Bearer AUTH_TOKEN", then echo
"Attempts of a request" are counted per prompt text (all messages' content, or the prompt).

GET /stats: {"max_in_flight", "in_flight", "total", "attempts": {key: count},
             "requests": [{"path", "body", "auth"}...]}  ("auth": whether a Bearer header came).
Quiet: nothing on stdout/stderr (the test reads neither while the server runs).
"""
import json
import os
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
STATE = {"in_flight": 0, "max_in_flight": 0, "total": 0, "attempts": {}, "requests": []}
AUTH_TOKEN = sys.argv[2] if len(sys.argv) > 2 else "sk-fake-secret"


def prompt_text(body, chat):
    if chat:
        messages = body.get("messages", [])
        return messages[-1]["content"] if messages else ""
    return body.get("prompt", "")


def attempt_key(body, chat):
    if chat:
        return "\n".join(m.get("content", "") for m in body.get("messages", []))
    return body.get("prompt", "")


def mode_of(body, text):
    match = re.match(r"\[mode:([\w-]+)\]", text)
    return match.group(1) if match else body.get("model", "echo")


def echo_response(body, chat, text, n):
    tokens = text.split()
    logprobs_wanted = bool(body.get("logprobs"))
    choices = []
    for i in range(n):
        choice = {"index": i, "finish_reason": "stop"}
        values = [-0.5 * (j + 1) for j in range(len(tokens))]
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
            choice["logprobs"] = ({"content": [{"token": t, "logprob": v} for t, v in zip(tokens, values)]}
                                  if logprobs_wanted else None)
        else:
            choice["text"] = text
            choice["logprobs"] = ({"tokens": tokens, "token_logprobs": values} if logprobs_wanted else None)
        choices.append(choice)
    return {"id": "cmpl-fake", "object": "chat.completion" if chat else "text_completion",
            "model": body.get("model"), "choices": choices,
            "usage": {"prompt_tokens": len(attempt_key(body, chat).split()),
                      "completion_tokens": len(tokens), "total_tokens": 0}}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so the client's connection reuse is exercised

    def log_message(self, *args):
        pass

    def send_json(self, status, payload, headers=None, cut=False):
        data = json.dumps(payload).encode()
        if cut:
            data = data[: len(data) // 2]
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path != "/stats":
            return self.send_json(404, {"error": "not found"})
        with LOCK:
            snapshot = json.loads(json.dumps(STATE))
        self.send_json(200, snapshot)

    def do_POST(self):
        with LOCK:
            STATE["in_flight"] += 1
            STATE["max_in_flight"] = max(STATE["max_in_flight"], STATE["in_flight"])
        try:
            self.answer()
        finally:
            with LOCK:
                STATE["in_flight"] -= 1

    def answer(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        chat = self.path == "/v1/chat/completions"
        if not chat and self.path != "/v1/completions":
            return self.send_json(404, {"error": {"message": f"no route {self.path}"}})
        body = json.loads(raw)
        authorization = self.headers.get("Authorization", "")
        key = attempt_key(body, chat)
        with LOCK:
            STATE["total"] += 1
            attempt = STATE["attempts"][key] = STATE["attempts"].get(key, 0) + 1
            STATE["requests"].append({"path": self.path, "body": body,
                                      "auth": authorization.startswith("Bearer ")})
        text = prompt_text(body, chat)
        mode = mode_of(body, text)
        n = int(body.get("n", 1))
        if mode.startswith("slow-"):
            time.sleep(float(mode[len("slow-"):]))
        elif mode.startswith("fail-") and attempt <= int(mode[len("fail-"):]):
            return self.send_json(500, {"error": {"message": f"scripted failure {attempt}"}})
        elif mode == "ratelimit" and attempt == 1:
            return self.send_json(429, {"error": {"message": "slow down"}}, {"Retry-After": "1"})
        elif mode == "truncated" and attempt == 1:
            return self.send_json(200, echo_response(body, chat, text, n), cut=True)
        elif mode == "bad-request":
            return self.send_json(400, {"error": {"message": "unsupported parameter: scripted 400"}})
        elif mode == "one-choice":
            n = 1
        elif mode == "auth" and authorization != f"Bearer {AUTH_TOKEN}":
            return self.send_json(401, {"error": {"message": "invalid api key"}})
        self.send_json(200, echo_response(body, chat, text, n))


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the default listen backlog of 5 is below the tests' concurrency

    def handle_error(self, request, client_address):
        pass  # a client that timed out and hung up: expected, and stderr must stay quiet


def main():
    server = Server(("127.0.0.1", 0), Handler)
    port_file = sys.argv[1]
    with open(port_file + ".tmp", "w") as f:
        f.write(str(server.server_address[1]))
    os.rename(port_file + ".tmp", port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
