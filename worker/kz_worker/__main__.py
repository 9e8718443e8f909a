"""Entry point: `python -m kz_worker` reads one JSON request on stdin, evaluates it (or, with
"mode": "validate_module", validates a proposed module) and writes the verdict on fd 3
(protocol.py). Run by the C++ supervisor, one process per evaluation."""
import json
import os
import sys


def main() -> int:
    request = json.loads(sys.stdin.read())
    if request["device"] == "cpu":
        # Must be set before triton is imported (by us or by the candidate).
        os.environ["TRITON_INTERPRET"] = "1"
    from . import protocol, sandbox
    channel = protocol.Channel()
    protocol.silence_stdout()
    sandbox.install(request)  # request["sandbox"]: the audit hook, before any reference or candidate code
    if request.get("mode") == "validate_module":  # a Proposer's module (validate.py)
        from .validate import validate_module
        result = validate_module(request, channel)
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
