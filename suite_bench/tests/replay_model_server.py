"""A scripted stand-in for a kernel-writing model, served over the OpenAI chat API on loopback.

It recognises which reference module a prompt contains (by matching the suite's sources) and
answers like a model would: some reasoning in <think>, then a fenced code block. Which answer a
sample gets is a deterministic function of (seed, task, sample index): mostly the bundled example
candidate (correct), sometimes a wrong variant, a syntax error, or a reply with no code. Used by
the `kz bench` tests and end-to-end runs of `kz bench` on the CPU; it is not a model.

    python3 replay_model_server.py --suite suite/kzbench --candidates suite/examples/triton \
        --port-file /tmp/port [--port 0] [--correct 60 --wrong 15 --broken 13]
GET /stats returns {"requests": N, "choices": M} so tests can check that a resumed run did not
generate again.
"""
import argparse
import hashlib
import json
import pathlib
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# The broken variants are shared with the benchmark batch (bench/make_eval_batch.py).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "suite"))
from candidate_variants import make_variant  # noqa: E402


class Replay:
    def __init__(self, args):
        self.references = {}
        for path in sorted(pathlib.Path(args.suite).rglob("*.py")):
            self.references[path.stem] = " ".join(path.read_text().split())
        self.candidates = {p.stem: p.read_text() for p in pathlib.Path(args.candidates).glob("*.py")}
        self.mix = (args.correct, args.correct + args.wrong, args.correct + args.wrong + args.broken)
        self.lock = threading.Lock()
        self.requests = 0
        self.choices = 0

    def task_of(self, prompt: str):
        flat = " ".join(prompt.split())
        for task, source in self.references.items():
            if source in flat:
                return task
        return None

    def answer(self, task, seed, index) -> str:
        roll = int(hashlib.sha256(f"{seed}/{task}/{index}".encode()).hexdigest(), 16) % 100
        thinking = f"<think>The reference is {task}. Plan: one kernel, bounds-checked.</think>\n"
        code = self.candidates.get(task)
        if code is None or roll >= self.mix[2]:
            return thinking + "I am not sure how to write this kernel."
        if roll >= self.mix[1]:
            code = make_variant(code, "python_syntax")
        elif roll >= self.mix[0]:
            code = make_variant(code, "wrong_result")
        return thinking + "Here is the implementation:\n\n```python\n" + code + "\n```\n"


def make_handler(replay: Replay):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def reply(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path.endswith("/stats"):
                with replay.lock:
                    self.reply(200, {"requests": replay.requests, "choices": replay.choices})
            else:
                self.reply(404, {"error": "not found"})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            if not self.path.endswith("/chat/completions"):
                return self.reply(404, {"error": {"message": "only /v1/chat/completions"}})
            prompt = "\n".join(m.get("content", "") for m in body.get("messages", []))
            task = replay.task_of(prompt)
            n, seed = int(body.get("n", 1)), body.get("seed", 0)
            choices = []
            for i in range(n):
                text = replay.answer(task, seed, i) if task else "I do not recognise this module."
                choices.append({"index": i, "message": {"role": "assistant", "content": text},
                                "finish_reason": "stop"})
            with replay.lock:
                replay.requests += 1
                replay.choices += n
            completion_tokens = sum(len(c["message"]["content"]) // 4 for c in choices)
            self.reply(200, {"id": "replay", "object": "chat.completion", "model": body.get("model"),
                             "choices": choices,
                             "usage": {"prompt_tokens": len(prompt) // 4, "completion_tokens": completion_tokens}})

    return Handler


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", required=True)
    parser.add_argument("--candidates", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--correct", type=int, default=60)
    parser.add_argument("--wrong", type=int, default=15)
    parser.add_argument("--broken", type=int, default=13)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(Replay(args)))
    pathlib.Path(args.port_file).write_text(str(server.server_address[1]))
    server.serve_forever()


if __name__ == "__main__":
    main()
