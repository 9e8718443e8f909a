"""The fork server: prepares once, then forks a fresh child for each request.

A worker started per evaluation spends ~12 s on the GPU host before its request can run (torch and
Triton imports ~4.5 s, the audit's torch._dynamo import ~4 s, measured by
bench/worker_startup_probe.py); a child forked from a process that did the host part of that is
ready in ~1 s (its CUDA context and the profiler). The supervisor starts one server per evaluation
running at once, inside the same sandbox a worker gets (limits, namespaces, scratch dir), and
sends it requests one at a time:

  stdin   one JSON request per line; EOF ends the server
  fd 3    the child's messages, relayed (protocol.py), then after the child is gone:
          {"type": "fork_server_done", "exit_code": N | null, "signal": N | null, "cpu_s": F,
           "limit": "cpu_time" | "file_size" | null, "leftovers": N}

Every request gets a new process, forked from the prepared server, never a reused one: the child
runs in the request's scratch dir (a fresh directory inside the server's), with stdin closed and
the pipe to the server as fd 3. A child cannot reach the server: the server is not dumpable (no
/proc/<pid>/mem, no ptrace without the capabilities the sandbox drops), the child does not inherit
the server's message pipe, and a "fork_server_done" it sends is relayed as "forged_message" (the
supervisor's protocol error). Messages are relayed re-serialised, so the supervisor reads what was
parsed here. Before "done", every process the child left is killed (the server is their
subreaper, so daemons that double-fork come back to it); the supervisor then clears the scratch
dirs before the next request. A server that cannot kill them says so ("leftovers"), and the
supervisor replaces it.
"""
import ctypes
import json
import os
import resource
import select
import signal
import sys
import tempfile
import time
import traceback

from . import process

MESSAGE_FD = 3
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
DONE = "fork_server_done"


def serve(device_name: str) -> int:
    process.quietly(process.prepare_host, device_name)
    _prctl(PR_SET_DUMPABLE, 0)         # children (same uid, no capabilities) cannot read our memory
    _prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans of a child come back to us, to be killed
    while line := sys.stdin.buffer.readline():
        if line.strip():
            serve_one(json.loads(line))
    return 0


def serve_one(request: dict) -> None:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        try:
            os.close(read_fd)
            run_child(request, write_fd)
        except BaseException:
            traceback.print_exc()  # the supervisor shows the tail of stderr with the crash
        finally:
            os._exit(70)
    os.close(write_fd)
    status, usage = relay_until_exit(pid, read_fd)
    os.close(read_fd)
    leftovers = kill_descendants()
    _send_raw(done_message(status, usage, leftovers))


def run_child(request: dict, message_fd: int) -> None:
    os.dup2(message_fd, MESSAGE_FD)  # replaces the server's own pipe to the supervisor
    os.close(message_fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # the server's stdin holds the next requests
    os.close(null)
    _prctl(PR_SET_DUMPABLE, 1)  # like any worker: its own /proc entries readable as usual
    scratch = request["scratch_dir"]
    os.chdir(scratch)
    os.environ["HOME"] = os.environ["TMPDIR"] = scratch
    tempfile.tempdir = None  # computed again from TMPDIR
    process.quietly(process.prepare_device, request["device"])
    process.evaluate(request)


def relay_until_exit(pid: int, read_fd: int):
    """Relays the child's message lines until it exits; then what it left in the pipe (a grandchild
    holding the pipe open must not keep us here)."""
    pidfd = _pidfd(pid)
    buffer = b""
    poller = select.poll()
    poller.register(read_fd, select.POLLIN)
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    pipe_open = True
    while True:
        events = dict(poller.poll(None if pidfd is not None else 20))  # no pidfd: look every 20 ms
        if pipe_open and read_fd in events:
            chunk = os.read(read_fd, 1 << 16)
            if chunk:
                buffer = _relay_lines(buffer + chunk)
            else:
                pipe_open = False
                poller.unregister(read_fd)
        if pidfd in events if pidfd is not None else _exited(pid):
            break
    os.set_blocking(read_fd, False)
    while pipe_open:
        try:
            chunk = os.read(read_fd, 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        buffer = _relay_lines(buffer + chunk)
    if buffer:
        _relay_lines(buffer + b"\n")
    if pidfd is not None:
        os.close(pidfd)
    _, status, usage = os.wait4(pid, 0)
    return status, usage


def _pidfd(pid: int):
    """A descriptor that polls readable when the child exits (Linux 5.3+), else None."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _exited(pid: int) -> bool:
    """Whether the child has exited, without reaping it."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _relay_lines(data: bytes) -> bytes:
    """Relays the complete lines of `data`; returns the incomplete rest."""
    *lines, rest = data.split(b"\n")
    for line in lines:
        try:
            message = json.loads(line)
        except ValueError:
            message = None
        if isinstance(message, dict):
            if message.get("type") == DONE:
                message = {"type": "forged_message"}
            line = json.dumps(message).encode()
        _send_raw(line)
    return rest


def kill_descendants(deadline_s: float = 5.0) -> int:
    """SIGKILLs every process below this one and reaps them; the number still alive at the deadline."""
    me = os.getpid()
    stop = time.monotonic() + deadline_s
    while True:
        _reap_children()
        below = _descendants(me)
        if not below or time.monotonic() > stop:
            return len(below)
        for pid in below:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.005)


def _descendants(root: int) -> list:
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()  # after "pid (comm) "
        if fields[0] == b"Z":
            continue  # a zombie: reaped by its parent, or by us once it is reparented
        children.setdefault(int(fields[1]), []).append(int(name))
    found, frontier = [], [root]
    while frontier:
        kids = children.get(frontier.pop(), [])
        found += kids
        frontier += kids
    return found


def _reap_children() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def done_message(status: int, usage, leftovers: int) -> dict:
    exit_code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    cpu_s = usage.ru_utime + usage.ru_stime
    cpu_limit, _ = resource.getrlimit(resource.RLIMIT_CPU)
    limit = None
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_limit != resource.RLIM_INFINITY
                                 and cpu_s >= cpu_limit):  # SIGXCPU ignored: SIGKILL at the hard limit
        limit = "cpu_time"
    elif sig == signal.SIGXFSZ:
        limit = "file_size"
    return {"type": DONE, "exit_code": exit_code, "signal": sig, "cpu_s": cpu_s, "limit": limit,
            "leftovers": leftovers}


def _send_raw(message) -> None:
    data = message if isinstance(message, bytes) else json.dumps(message).encode()
    data += b"\n"
    while data:
        data = data[os.write(MESSAGE_FD, data):]


def _prctl(option: int, value: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: nothing to set
