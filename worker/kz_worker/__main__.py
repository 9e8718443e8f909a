"""Entry point: `python -m kz_worker` reads one JSON request on stdin, evaluates it and writes the
verdict on fd 3 (protocol.py). Run by the C++ supervisor, one process per evaluation."""
import json
import os
import sys


def main() -> int:
    request = json.loads(sys.stdin.read())
    if request["device"] == "cpu":
        # Must be set before triton is imported (by us or by the candidate).
        os.environ["TRITON_INTERPRET"] = "1"
    from . import protocol
    channel = protocol.Channel()
    protocol.silence_stdout()
    from .harness import Evaluation
    result = Evaluation(request, channel).run()
    result["type"] = "result"
    channel.send(result)
    # Skip interpreter teardown: a candidate's broken destructors must not turn a verdict
    # into a crash after it was sent.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
