"""A candidate's (or a proposed module's) Python syntax, checked before any worker starts.

`python -S -m kz_worker.syntax_check` imports neither torch nor site-packages (~20 ms to start) and
serves the supervisor's SyntaxChecker (eval/include/kz/eval/syntax_check.h) for as long as it lives:
one JSON object per line on stdin, {"source": "...", "filename": "candidate.py"}, one answer per line
on fd 3, {"error": TEXT} where Python's compiler refuses the source (TEXT: what it says, e.g.
"invalid syntax (candidate.py, line 7)"), {"error": null} where it compiles, {"unknown": NAME} where
compiling raised something else (a RecursionError, a MemoryError under this process's limits): the
worker then decides, as it would have without the check. Compiling runs none of the source's code.

So a candidate that is not valid Python (an RL policy's truncated or garbled answer) costs a
millisecond instead of a worker: a process, the reference's load and, in a cold batch, a place in
the first wave that waits for the zygote's imports and a CUDA context. The worker checks again with
the same function (loading.load_candidate, validate.check_loads), so the verdict is the same either
way.
"""
import json
import os
import sys

from .protocol import MESSAGE_FD


def syntax_error(source: str, filename: str):
    """What Python's compiler says where `source` is not valid Python (compile() raises SyntaxError or
    a subclass: IndentationError, TabError), else None. Other exceptions propagate."""
    try:
        compile(source, filename, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return str(exc)
    return None


def answer(line: str) -> dict:
    try:
        request = json.loads(line)
        return {"error": syntax_error(request["source"], request["filename"])}
    except Exception as exc:  # not a syntax verdict: the worker's own compile decides
        return {"unknown": type(exc).__name__}


def serve() -> int:
    out = os.fdopen(MESSAGE_FD, "w", buffering=1)
    for line in sys.stdin:
        out.write(json.dumps(answer(line)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(serve())
