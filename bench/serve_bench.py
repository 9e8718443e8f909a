#!/usr/bin/env python3
"""The served path against the in-process engine on the same work: `kz serve-model` under concurrent
requests, and `kz generate --prompts` (one engine call), at the same batch.

    bench/serve_bench.py --kz build/kz --kz-engine build/kz-engine --out OUTDIR
        [--preset qwen2.5-7b | --model DIR] [--device cuda:0] [--requests 64] [--prompt-words 300]
        [--new 256] [--temperature 1] [--stream-share 0.5]

The work: --requests prompts of --prompt-words random words, each with its own seed, --new new
tokens, eos ignored (both sides run every request to its limit). In process: `kz generate --prompts`,
every request in one engine call (continuous batching up to --requests rows); its tokens/s are the
new tokens over the call's generate_s (the load excluded). Served: `kz serve-model` with the model
loaded, then every request sent at once from its own thread (a --stream-share of them streamed,
server-sent events), POST /v1/completions; tokens/s are the new tokens (usage) over the time from
the first send to the last answer. Neither side is warmed up: each pays its CUDA graphs' capture.
The same seeds and prompts give the same texts on both sides, up to the batch's effect on floating
point; the report counts the texts that match. Goal: served >= 0.90x in-process.

--preset writes a random-init checkpoint with `kz init-model` (in --work-dir, kept for the next run).
Writes OUTDIR/serve_bench.json and prints the table. Exit status 1 when a side failed or lost a
request, or a side's completions do not all run to --new tokens.
"""
import argparse
import concurrent.futures
import http.client
import json
import pathlib
import random
import subprocess
import sys
import threading
import time

GOAL = 0.90


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kz", type=pathlib.Path, default=pathlib.Path("build/kz"), help="kz (init-model)")
    p.add_argument("--kz-engine", type=pathlib.Path, default=pathlib.Path("build/kz-engine"),
                   help="kz-engine (generate, serve-model)")
    p.add_argument("--out", type=pathlib.Path, required=True)
    p.add_argument("--model", type=pathlib.Path, help="checkpoint directory (else --preset, written here)")
    p.add_argument("--preset", default="qwen2.5-7b", help="kz init-model preset where --model is not given")
    p.add_argument("--work-dir", type=pathlib.Path, default=pathlib.Path("runs/serve-bench"))
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--requests", type=int, default=64, help="at least 1; the server gets as many HTTP threads")
    p.add_argument("--prompt-words", type=int, default=300)
    p.add_argument("--new", type=int, default=256, help="new tokens per request")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--stream-share", type=float, default=0.5, help="share of the served requests streamed")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout-s", type=float, default=900, help="each side's limit")
    p.add_argument("--require-same-texts", action="store_true",
                   help="fail unless every text matches across the sides (batch-invariant decoding, as on the CPU)")
    args = p.parse_args(argv)
    if args.requests < 1 or args.new < 1 or not 0 <= args.stream_share <= 1:
        p.error("--requests and --new must be >= 1, --stream-share in [0, 1]")
    return args


def make_work(args) -> list:
    """The requests: a prompt of random words and a seed each (the same on both sides)."""
    rng = random.Random(args.seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    work = []
    for i in range(args.requests):
        words = ("".join(rng.choice(letters) for _ in range(rng.randint(3, 8))) for _ in range(args.prompt_words))
        work.append({"prompt": " ".join(words), "seed": args.seed * 100003 + i, "max_new_tokens": args.new})
    return work


def checkpoint(args) -> pathlib.Path:
    if args.model:
        return args.model
    model = args.work_dir / f"model-{args.preset}"
    if not (model / "config.json").exists() or not list(model.glob("*.safetensors")):
        subprocess.run([str(args.kz), "init-model", "--preset", args.preset, "--out", str(model)], check=True,
                       stdout=subprocess.DEVNULL)
    return model


def in_process(args, model: pathlib.Path, work: list) -> dict:
    """`kz generate --prompts`: every request in one engine call."""
    prompts = args.work_dir / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(w) + "\n" for w in work))
    command = [str(args.kz_engine), "generate", "--model", str(model), "--prompts", str(prompts), "--json",
               "--device", args.device, "--temperature", str(args.temperature), "--top-p", "1", "--top-k", "0",
               "--ignore-eos", "--max-new-tokens", str(args.new), "--max-batch-rows", str(args.requests)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"kz generate: {exc}"}
    if done.returncode != 0:
        return {"error": f"kz generate exited {done.returncode}: {done.stderr.strip()[-600:]}"}
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    seconds = lines[0]["generate_s"] if lines else 0.0
    tokens = sum(line["completion_tokens"] for line in lines)
    return {"completions": len(lines), "new_tokens": tokens, "seconds": seconds,
            "tokens_per_s": tokens / seconds if seconds else 0.0, "texts": [line["text"] for line in lines],
            "completion_tokens": [line["completion_tokens"] for line in lines]}


class Server:
    """`kz serve-model` on a free port, until closed."""

    def __init__(self, args, model: pathlib.Path):
        config = args.work_dir / "serve.toml"  # a thread per request: none waits for a connection
        config.write_text(f"[serve]\nhttp_threads = {max(64, args.requests)}\n")
        command = [str(args.kz_engine), "serve-model", "--model", str(model), "--device", args.device, "--port", "0",
                   "--config", str(config), "--max-batch", str(args.requests), "--max-batch-rows", str(args.requests)]
        self.log = open(args.out / "serve-model.log", "w")
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.PIPE, text=True)
        self.port = None
        self.lines = []
        self.reader = threading.Thread(target=self._read_stderr, daemon=True)
        self.reader.start()
        deadline = time.monotonic() + args.timeout_s
        while self.port is None and self.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if not self.port:
            self.close()
            raise RuntimeError("kz serve-model did not start: " + " | ".join(self.lines[-5:]))

    def _read_stderr(self):
        for line in self.process.stderr:
            self.lines.append(line.rstrip())
            self.log.write(line)
            self.log.flush()
            if "serving" in line and "http://" in line and self.port is None:
                try:
                    self.port = int(line.split("http://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
                except (IndexError, ValueError):
                    self.port = 0  # not a port: the start fails below, naming the line

    def close(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.reader.join(10)  # its last lines into the log before it closes
        self.log.close()


def complete(port: int, request: dict, stream: bool, timeout: float) -> dict:
    """One POST /v1/completions; the text and the new tokens (usage), streamed or not."""
    body = {"prompt": request["prompt"], "max_tokens": request["max_new_tokens"], "seed": request["seed"],
            "temperature": request["temperature"], "top_p": 1.0, "ignore_eos": True, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            return {"error": f"HTTP {response.status}: {response.read()[:300]!r}"}
        if not stream:
            answer = json.loads(response.read())
            return {"text": answer["choices"][0]["text"], "new_tokens": answer["usage"]["completion_tokens"]}
        text, tokens = [], None
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: "):])
            text += [c.get("text", "") for c in event.get("choices") or []]
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
        return {"text": "".join(text), "new_tokens": tokens, "streamed": True}
    except (OSError, ValueError, KeyError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        connection.close()


def served(args, model: pathlib.Path, work: list) -> dict:
    """Every request at once from its own thread against one `kz serve-model`."""
    try:
        server = Server(args, model)
    except (OSError, RuntimeError) as exc:
        return {"error": f"kz serve-model: {exc}"}
    try:
        # Spread evenly: request i is streamed where the share's running count steps up at it.
        streamed = {i for i in range(len(work)) if int((i + 1) * args.stream_share) > int(i * args.stream_share)}
        requests = [dict(w, temperature=args.temperature) for w in work]
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
            answers = list(pool.map(lambda i: complete(server.port, requests[i], i in streamed, args.timeout_s),
                                    range(len(requests))))
        seconds = time.monotonic() - started
    finally:
        server.close()
    errors = [a["error"] for a in answers if "error" in a]
    if errors:
        return {"error": f"{len(errors)} of {len(answers)} requests failed, e.g. {errors[0]}"}
    tokens = sum(a["new_tokens"] or 0 for a in answers)
    return {"completions": len(answers), "streamed": len(streamed), "new_tokens": tokens, "seconds": seconds,
            "tokens_per_s": tokens / seconds if seconds else 0.0, "texts": [a["text"] for a in answers],
            "completion_tokens": [a["new_tokens"] for a in answers]}


def report(args, model, local: dict, remote: dict) -> dict:
    result = {"model": str(model), "device": args.device, "requests": args.requests, "new": args.new,
              "prompt_words": args.prompt_words, "temperature": args.temperature, "goal": GOAL,
              "in_process": {k: v for k, v in local.items() if k != "texts"},
              "served": {k: v for k, v in remote.items() if k != "texts"}}
    if "error" not in local and "error" not in remote:
        result["ratio"] = remote["tokens_per_s"] / local["tokens_per_s"] if local["tokens_per_s"] else None
        result["same_texts"] = sum(a == b for a, b in zip(local["texts"], remote["texts"]))
    return result


def table(result: dict) -> str:
    rows = [f"{'side':<12} {'completions':>11} {'new tokens':>10} {'seconds':>8} {'tokens/s':>9}"]
    for side in ("in_process", "served"):
        r = result[side]
        if "error" in r:
            rows.append(f"{side:<12} error: {r['error']}")
        else:
            rows.append(f"{side:<12} {r['completions']:>11} {r['new_tokens']:>10} {r['seconds']:>8.2f} "
                        f"{r['tokens_per_s']:>9.1f}")
    if result.get("ratio") is not None:
        rows.append(f"served / in-process: {result['ratio']:.3f}x (goal >= {GOAL:.2f}x); "
                    f"same texts {result['same_texts']} of {result['requests']}")
    return "\n".join(rows)


def complete_work(side: dict, args) -> bool:
    """Every request answered, each with --new tokens (eos ignored)."""
    return "error" not in side and side["completions"] == args.requests and \
        all(n == args.new for n in side["completion_tokens"])


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    model = checkpoint(args)
    work = make_work(args)
    local = in_process(args, model, work)
    remote = served(args, model, work)
    result = report(args, model, local, remote)
    (args.out / "serve_bench.json").write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    ok = complete_work(local, args) and complete_work(remote, args)
    if not ok:
        print("serve_bench: a side failed, lost a request or stopped short of --new tokens", file=sys.stderr)
    if ok and args.require_same_texts and result["same_texts"] != args.requests:
        print(f"serve_bench: {args.requests - result['same_texts']} texts differ across the sides", file=sys.stderr)
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
