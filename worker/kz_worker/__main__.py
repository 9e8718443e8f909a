"""Entry point: `python -m kz_worker` reads one JSON request on stdin, evaluates it (or, with
"mode": "validate_module", validates a proposed module) and writes the verdict on fd 3
(protocol.py). Run by the C++ supervisor, one process per evaluation.

With KZ_WORKER_PRELOAD=1 the worker imports torch, its own modules and Triton before it reads the
request: the supervisor starts it ahead of time ([worker] prestart) and sends the request when an
evaluation needs a worker. On the CPU the supervisor then sets TRITON_INTERPRET=1 itself, since
Triton reads it when imported."""
import json
import os
import sys


def preload() -> None:
    """What every evaluation on this worker's device does first, done before its request arrives:
    imports, and on a GPU the CUDA context and the audit's machinery (cheats.warm_up: torch._dynamo,
    the profiler). All of it precedes the harness's identity snapshot, as it would without a spare."""
    import torch
    from . import cheats, harness, validate  # noqa: F401
    device = torch.device(os.environ.get("KZ_WORKER_DEVICE") or "cpu")
    # Triton fixes interpreter mode at import: only where it is decided already (the supervisor sets
    # TRITON_INTERPRET for CPU evaluations) or where a GPU makes compiled mode the one wanted.
    if os.environ.get("TRITON_INTERPRET") == "1" or device.type == "cuda":
        try:
            import triton.runtime.jit  # noqa: F401
        except ImportError:
            pass
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.empty(1, device=device)  # the CUDA context
    cheats.warm_up(device)


def main() -> int:
    if os.environ.get("KZ_WORKER_PRELOAD") == "1":
        try:
            preload()
        except Exception:  # best effort: the evaluation redoes each step and fails in its own stage, rightly classified
            pass
    text = sys.stdin.read()
    if not text:  # a spare whose supervisor ended without needing it
        return 0
    request = json.loads(text)
    if request["device"] == "cpu":
        # Must be set before triton is imported (by us or by the candidate).
        os.environ["TRITON_INTERPRET"] = "1"
    from . import protocol, sandbox
    channel = protocol.Channel()
    protocol.silence_stdout()
    sandbox.install(request)  # request["sandbox"]: the audit hook, before any reference or candidate code
    if request.get("mode") == "validate_module":  # a Proposer's module (validate.py)
        from .validate import reject_sandbox_violations, validate_module
        result = validate_module(request, channel)
        reject_sandbox_violations(result)
    else:
        from .harness import Evaluation
        result = Evaluation(request, channel).run()
        sandbox.apply(result)  # a recorded violation makes the verdict sandbox_violation
    result["type"] = "result"
    channel.send(result)
    # Skip interpreter teardown: a candidate's broken destructors must not turn a verdict
    # into a crash after it was sent.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
