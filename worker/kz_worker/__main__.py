"""Entry point: `python -m kz_worker` reads one JSON request on stdin, evaluates it (or, with
"mode": "validate_module", validates a proposed module) and writes the verdict on fd 3
(protocol.py). Run by the C++ supervisor, one process per evaluation (its CUDA context made during
its imports: process.EarlyContext), or, with
KZ_WORKER_FORK_SERVER=1, as a fork server (fork_server.py) that forks one child per request, or,
with KZ_WORKER_ZYGOTE=1 too, as a zygote (zygote.py) that forks fork servers."""
import json
import os
import sys

from . import process


def main() -> int:
    if os.environ.get("KZ_WORKER_ZYGOTE") == "1":
        from . import fork_server, zygote
        child = zygote.serve(os.environ.get("KZ_WORKER_DEVICE") or "cpu")
        return fork_server.serve_prepared(child.device, child.env) if child is not None else 0
    if os.environ.get("KZ_WORKER_FORK_SERVER") == "1":
        from . import fork_server
        return fork_server.serve(os.environ.get("KZ_WORKER_DEVICE") or "cpu")
    # The context first, in a thread, while this thread reads the request and imports.
    early = process.EarlyContext(os.environ.get("KZ_WORKER_DEVICE") or "cpu")
    text = sys.stdin.read()
    if not text:
        return 0
    request = json.loads(text)
    if request["device"] == "cpu":
        # Must be set before triton is imported (by us or by the candidate).
        os.environ["TRITON_INTERPRET"] = "1"
    request["startup_s"] = process.prepare_fresh(request["device"], early)
    process.evaluate(request)
    return 0


if __name__ == "__main__":
    sys.exit(main())
