"""Entry point: `python -m kz_worker` reads one JSON request on stdin, evaluates it (or, with
"mode": "validate_module", validates a proposed module) and writes the verdict on fd 3
(protocol.py). Run by the C++ supervisor, one process per evaluation.

Every worker prepares the same way before any reference or candidate code (prepare()): imports,
and on a GPU the CUDA context and the audit's machinery, so the harness's identity snapshot is the
same whether or not the worker was started ahead. With KZ_WORKER_PRELOAD=1 it prepares before it
reads the request: the supervisor starts it ahead of time ([worker] prestart, KZ_WORKER_DEVICE)
and sends the request when an evaluation needs a worker. On the CPU the supervisor then sets
TRITON_INTERPRET=1 itself, since Triton reads it when imported."""
import json
import os
import sys


def prepare(device_name: str) -> None:
    """What every evaluation on this worker's device does first: imports, and on a GPU the CUDA
    context and the audit's machinery (cheats.warm_up: torch._dynamo, the profiler)."""
    import torch
    from . import cheats, harness, validate  # noqa: F401
    device = torch.device(device_name)
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


def prepare_quietly(device_name: str) -> None:
    try:
        prepare(device_name)
    except Exception:  # the evaluation redoes each step and fails in its own stage, rightly classified
        pass


def main() -> int:
    prepared = os.environ.get("KZ_WORKER_PRELOAD") == "1"
    if prepared:
        prepare_quietly(os.environ.get("KZ_WORKER_DEVICE") or "cpu")
    text = sys.stdin.read()
    if not text:  # a spare whose supervisor ended without needing it
        return 0
    request = json.loads(text)
    if request["device"] == "cpu":
        # Must be set before triton is imported (by us or by the candidate).
        os.environ["TRITON_INTERPRET"] = "1"
    if not prepared:
        prepare_quietly(request["device"])
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
