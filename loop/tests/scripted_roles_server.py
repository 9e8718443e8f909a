"""A scripted OpenAI-compatible chat server that plays both roles of `kz evolve` (stdlib only).

Usage: scripted_roles_server.py PORT_FILE
Listens on 127.0.0.1 at a port the OS picks and writes it to PORT_FILE (through a renamed temporary
file). POST /v1/chat/completions answers `n` choices; choice i is (an offset drawn from a hash of
the request's seed and prompt, plus i) modulo the kinds of reply, so the same request always gets
the same replies (a killed and resumed run sees what an uninterrupted one saw) and a request for
several gets each kind.

- A Proposer prompt (it lists the APIs to use) gets a module chaining those APIs (unary ops from
  data/unary_catalogue.toml) over one input: the plain chain, the chain scaled by 0.5, or a broken
  module (a syntax error).
- A Coder prompt (it holds a reference module) gets a Triton kernel for the chain the module's
  docstring names: correct, or missing the last op (incorrect), in turn. A module
  without a chain (a held-out task) gets a reply without code.
Used by loop/tests/evolve_test.cpp; it is not a model.
"""
import hashlib
import json
import os
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TORCH = {"torch.relu": "torch.relu(x)", "torch.sigmoid": "torch.sigmoid(x)", "torch.abs": "torch.abs(x)",
         "torch.neg": "torch.neg(x)"}
TRITON = {"torch.relu": "tl.maximum(x, 0.0)", "torch.sigmoid": "tl.sigmoid(x)", "torch.abs": "tl.abs(x)",
          "torch.neg": "-x"}


def draw(seed, index, text, choices):
    digest = hashlib.sha256(f"{seed}:{text}".encode()).digest()
    return (int.from_bytes(digest[:8], "little") + index) % choices


def module(apis, variant):
    steps = [f"        x = {TORCH[api]}" for api in apis]
    if variant == 1:
        steps.append("        x = x * 0.5")
    broken = "    def forward(self, x)\n" if variant == 2 else "    def forward(self, x):\n"
    chain = ",".join(apis) + (",scale" if variant == 1 else "")
    return (f'"""Scripted module. chain: {chain}"""\nimport torch\nimport torch.nn as nn\n\n\n'
            "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n\n"
            + broken + "\n".join(steps) + "\n        return x\n\n\n"
            "batch_size = 4096\ndim = 8192\ncpu_sizes = {\"batch_size\": 4, \"dim\": 64}\n\n\n"
            "def get_inputs():\n    return [torch.randn(batch_size, dim)]\n\n\n"
            "def get_init_inputs():\n    return []\n")


def kernel(chain, correct):
    ops = [TRITON[api] if api != "scale" else "x * 0.5" for api in chain]
    if not correct:
        ops = ops[:-1]
    steps = "".join(f"    x = {op}\n" for op in ops)
    return ("import torch\nimport torch.nn as nn\nimport triton\nimport triton.language as tl\n\n\n"
            "@triton.jit\ndef chain_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):\n"
            "    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n    mask = offsets < n\n"
            "    x = tl.load(x_ptr + offsets, mask=mask)\n" + steps
            + "    tl.store(y_ptr + offsets, x, mask=mask)\n\n\n"
            "class ModelNew(nn.Module):\n    def __init__(self):\n        super().__init__()\n\n"
            "    def forward(self, x):\n        x = x.contiguous()\n        y = torch.empty_like(x)\n"
            "        n = x.numel()\n        chain_kernel[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)\n"
            "        return y\n")


def reply(prompt, seed, index):
    apis = re.findall(r"^- (torch\.\w+)\s*$", prompt.split("uses every one of these APIs:")[-1], re.M)
    if "uses every one of these APIs:" in prompt and all(api in TORCH for api in apis) and apis:
        return "```python\n" + module(apis, draw(seed, index, prompt, 3)) + "```\n"
    found = re.findall(r"chain: ([\w.,]+)", prompt)
    if not found:
        return "I cannot write this one."
    return "```python\n" + kernel(found[-1].split(","), draw(seed, index, prompt, 2) == 0) + "```\n"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send_json(self, code, payload):
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if not self.path.endswith("/chat/completions"):
            self.send_json(404, {"error": {"message": "only /v1/chat/completions"}})
            return
        prompt = "\n".join(m.get("content", "") for m in body.get("messages", []))
        seed = body.get("seed", 0)
        choices = [{"index": i, "finish_reason": "stop",
                    "message": {"role": "assistant", "content": reply(prompt, seed, i)}}
                   for i in range(int(body.get("n", 1)))]
        self.send_json(200, {"id": "cmpl-scripted", "object": "chat.completion", "model": body.get("model"),
                             "choices": choices, "usage": {"prompt_tokens": 0, "completion_tokens": 0}})


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    tmp = sys.argv[1] + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(server.server_address[1]))
    os.replace(tmp, sys.argv[1])
    server.serve_forever()


if __name__ == "__main__":
    main()
