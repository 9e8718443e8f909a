"""The worker's side of the supervisor protocol.

Messages are JSON objects, one per line, on file descriptor 3 (a pipe the supervisor opened), so
nothing a candidate prints on stdout/stderr can forge one. The supervisor applies a deadline to
each announced stage and kills the worker's process group when it passes.

  {"type": "stage", "name": "compile"}        a stage begins
  {"type": "result", "status": ..., ...}      the verdict (last message)

Each carries "token": the request's "message_token", a secret the supervisor makes per request.
It is taken out of the request before any reference or candidate code runs and lives only in the
Channel, which candidate code can reach through no module (only through frames or the garbage
collector, which the sandbox's audit hook refuses it); a message without it is a forgery
(verdict cheat_detected, check forged_message).
"""
import json
import math
import os
import sys

MESSAGE_FD = 3


class Channel:
    def __init__(self, token=None):
        self._token = token
        try:
            os.fstat(MESSAGE_FD)
            self._out = os.fdopen(_relocate(MESSAGE_FD), "w", buffering=1, closefd=False)
        except OSError:  # run by hand, without the supervisor
            self._out = sys.__stdout__

    def send(self, message: dict) -> None:
        message = {**message, "token": self._token}
        self._out.write(json.dumps(_finite(message), default=str, allow_nan=False) + "\n")
        self._out.flush()

    def stage(self, name: str) -> None:
        self.send({"type": "stage", "name": name})


def _relocate(fd: int) -> int:
    """Moves the message pipe from fd 3 to a random high descriptor (close-on-exec, so compilers and
    other children do not inherit it) and closes fd 3: a candidate that writes a forged verdict to
    fd 3 writes nowhere. A speed bump, not a wall: the candidate runs in this process and can
    search its descriptors (docs/evaluation.md, "Holes that remain")."""
    import fcntl
    import random
    import resource
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    top = min(soft if soft != resource.RLIM_INFINITY else 4096, 4096)
    if top <= 128:
        return fd
    try:
        moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, random.SystemRandom().randrange(64, top - 32))
    except OSError:
        return fd
    os.close(fd)
    return moved


def _finite(value):
    """JSON has no NaN/Inf: they become null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(x) for k, x in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(x) for x in value]
    return value


def silence_stdout() -> None:
    """Sends everything written to stdout (by Python or C code) to stderr instead."""
    sys.stdout.flush()
    os.dup2(2, 1)
