"""The fork server: prepares once, then forks a fresh child for each request, ahead of it (a spare).

A worker started per evaluation spends seconds on the GPU host before its request can run (~12 s
measured on an H200: torch and Triton imports ~4.5 s, and an import of
torch._dynamo ~4 s that the audit no longer needs, cheats.wrap_manual_seed_as_dynamo_would); a
child forked from a process that did the host part of that is ready in ~1 s (its CUDA context), and
it does that before its request comes: the server forks the next child (class
Spare) as soon as the previous one has its device prepared (its first message; finish_child says
why not sooner). The supervisor starts one server per evaluation running at once, inside the same
sandbox a worker gets (limits, namespaces, scratch dir), and sends it requests one at a time:

  stdin   one JSON request per line; EOF ends the server
  fd 3    the child's messages, relayed (protocol.py), then after the child is gone:
          {"type": "fork_server_done", "exit_code": N | null, "signal": N | null, "cpu_s": F,
           "limit": "cpu_time" | "file_size" | null, "leftovers": N, "retire": bool,
           "error": "..." (only when no child could be started)}

Every request gets a new process, forked from the prepared server, never a reused one: the child
runs in the request's scratch dir (a fresh directory inside the server's), with stdin closed, the
supervisor's environment (not what the server's imports added to it) and the pipe to the server
as fd 3. What keeps a child from the next request's (docs/evaluation.md, "Fork servers"):
  - the server is not dumpable (no /proc/<pid>/mem, no ptrace without the capabilities the
    sandbox drops), and the child does not inherit the server's message pipe;
  - messages are relayed re-serialised, so the supervisor reads what was parsed here; a
    "fork_server_done" from the child, or a line that does not parse (nesting too deep, say),
    is relayed as "forged_message" / "invalid_message" (the supervisor's protocol error); too many
    or too long lines end the child;
  - before "done", every process below the server is killed, zombie-looking thread-group leaders
    included (the server is their subreaper, so daemons that double-fork come back to it); a
    server that cannot kill them says so ("leftovers") and is replaced;
  - where /dev/shm is the server's own tmpfs ([sandbox] shm_mb), the server empties it before
    "done", and retires where it cannot: the next request finds nothing a candidate left there;
  - the server retires ("retire") once its own CPU time passes half its RLIMIT_CPU, so that limit
    never ends a later request.
"""
import ctypes
import json
import os
import resource
import select
import signal
import stat
import sys
import tempfile
import time
import traceback

from . import process

MESSAGE_FD = 3
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1
DONE = "fork_server_done"
MAX_LINE_BYTES = 64 << 20        # a result with its tracebacks is far smaller
MAX_LINES = 100_000              # per request; stage messages are a handful
DRAIN_READS = 256                # reads of what the child left in the pipe after its exit
CHILD_SETUP_FAILED = 75          # the child's exit code when it could not set up (no candidate code ran)
SHARED_MEMORY_DIR = "/dev/shm"
OWN_TMPFS_SOURCE = "kz-tmpfs"    # the source of the sandbox's own tmpfs mounts (sandbox/src/sandbox_plan.h)


class TooMuchOutput(Exception):
    pass


def serve(device_name: str) -> int:
    environment = dict(os.environ)
    process.quietly(process.prepare_host, device_name)
    refuse_if_fork_unsafe()
    return serve_prepared(device_name, environment)


def serve_prepared(device_name: str, environment: dict) -> int:
    """Serves requests once the host part is prepared (and refuse_if_fork_unsafe passed), here or in
    a zygote (zygote.py)."""
    # What the imports put in the environment points into the scratch dir of whoever imported
    # (torch sets TORCHINDUCTOR_CACHE_DIR there): a child gets the supervisor's environment, as a
    # fresh worker does.
    os.environ.clear()
    os.environ.update(environment)
    prctl(PR_SET_DUMPABLE, 0)         # children (same uid, no capabilities) cannot read our memory
    prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans of a child come back to us, to be killed
    own_shm = own_tmpfs(SHARED_MEMORY_DIR)
    spare = Spare.start_if_possible(device_name)
    try:
        while line := sys.stdin.buffer.readline():
            if not line.strip():
                continue
            child = start_child(json.loads(line), spare)
            del line  # the next spare, forked later, gets no object of this request
            spare = (finish_child(child, device_name, own_shm) if child is not None
                     else Spare.start_if_possible(device_name))
    finally:
        if spare is not None:
            spare.discard()
    return 0


def refuse_if_fork_unsafe() -> None:
    """A CUDA context does not survive fork, and once CUDA was asked for its devices torch refuses it
    in every fork: either way every child would fail, and its failure would look like the candidate's."""
    torch = sys.modules.get("torch")  # not imported: nothing initialised CUDA
    if torch is None:
        return
    if torch.cuda.is_initialized():
        raise SystemExit("kz fork server: CUDA was initialised by the imports; children could not use it")
    if forks_refuse_cuda(torch):
        raise SystemExit("kz fork server: the imports asked CUDA for its devices, so torch refuses CUDA in "
                         "every fork; children could not use it")


def forks_refuse_cuda(torch) -> bool:
    """Whether a child forked now would be in torch's "bad fork" state (a forked probe says: ~30 ms)."""
    pid = os.fork()
    if pid == 0:
        os._exit(1 if torch.cuda._is_in_bad_fork() else 0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) != 0


class Spare:
    """A child forked ahead of its request, which prepares its device (the CUDA context: ~0.3-1 s on
    the H200) while the server waits for the request or relays the previous child's. It
    runs no candidate code until it gets its request, and until then it is not dumpable; it is
    forked after the server dropped the previous request, so it holds no object of it (freed memory
    may still hold its bytes, as in any process). A spare that a candidate stopped or killed
    (signals reach the whole process group) is replaced, never handed a request."""

    def __init__(self, pid: int, device: str, request_fd: int, message_fd: int):
        self.pid, self.device, self.request_fd, self.message_fd = pid, device, request_fd, message_fd
        # The process itself, not its pid: kill_descendants may reap a spare that died, and its pid
        # could then name another process.
        self.pidfd = _pidfd(pid)

    @classmethod
    def start(cls, device: str, close_in_child=()):
        """A new spare for `device`; OSError where the pipes or the fork fail (EAGAIN at a process
        limit, EMFILE...)."""
        request_read, request_write = os.pipe()
        message_read, message_write = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            for fd in (request_read, request_write, message_read, message_write):
                os.close(fd)
            raise
        if pid == 0:  # the child: never returns
            try:
                for fd in (request_write, message_read, *close_in_child):
                    os.close(fd)
                run_spare(device, request_read, message_write)
            except BaseException:
                traceback.print_exc()  # the supervisor shows the tail of stderr with the crash
            finally:
                os._exit(70)
        os.close(request_read)
        os.close(message_write)
        return cls(pid, device, request_write, message_read)

    @classmethod
    def start_if_possible(cls, device: str, close_in_child=()):
        """A spare, or None where none can be forked now (the request then forks its own child)."""
        try:
            return cls.start(device, close_in_child)
        except OSError:
            return None

    def ready_for(self, device: str) -> bool:
        """Prepared for this device and still waiting: alive and not stopped (state S, R or D)."""
        if self.device != device or not self.alive():
            return False
        fields = _stat_fields(self.pid)
        return bool(fields) and fields[0] in (b"S", b"R", b"D")

    def alive(self) -> bool:
        """Not exited: while it lives, its pid is its own (a pidfd polls readable once it exited)."""
        if self.pidfd is not None:
            return not _readable(self.pidfd)
        fields = _stat_fields(self.pid)
        return bool(fields) and fields[0] not in (b"Z", b"X")

    def hand_over(self, request: dict) -> bool:
        """Writes the request and closes the pipe (EOF: the request is complete); False where the
        spare died since ready_for looked (nothing reads the pipe)."""
        data = json.dumps({**request, "handed_over_at": time.monotonic()}).encode()
        try:
            while data:
                data = data[os.write(self.request_fd, data):]
        except BrokenPipeError:
            return False
        finally:
            os.close(self.request_fd)
            self.request_fd = None
        return True

    def discard(self) -> None:
        for fd in (self.request_fd, self.message_fd):
            if fd is not None:
                os.close(fd)
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass  # gone already (reaped by kill_descendants)
        self.close_pidfd()

    def own_fds(self) -> list:
        """The server's descriptors for this child, which a spare forked beside it must not keep."""
        return [fd for fd in (self.request_fd, self.message_fd, self.pidfd) if fd is not None]

    def close_pidfd(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def run_spare(device: str, request_fd: int, message_fd: int) -> None:
    """The spare child: its own message pipe as fd 3 and no stdin (the server's holds the next
    requests) at once, then its device, then it waits for its request (EOF without one: discarded)."""
    os.dup2(message_fd, MESSAGE_FD)  # replaces the server's own pipe to the supervisor
    os.close(message_fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # never outlives the server
    # A request handed over while the device is prepared waits in the pipe. (So does the EOF of a
    # spare being discarded, which then exits without a request: no harm.)
    process.quietly(process.prepare_device, device)
    prepared_at = time.monotonic()
    chunks = []
    while chunk := os.read(request_fd, 1 << 16):
        chunks.append(chunk)
    os.close(request_fd)
    if not chunks:
        os._exit(0)
    run_child(json.loads(b"".join(chunks)), prepared_at)


def start_child(request: dict, spare):
    """Hands the request to the spare, or to a child forked now where the spare is not ready for it;
    the child, or None where none could be forked (no candidate code ran: the server says so)."""
    child = spare if spare is not None and spare.ready_for(request["device"]) else None
    if child is None or not child.hand_over(request):
        if spare is not None:
            spare.discard()
        try:
            child = Spare.start(request["device"])
        except OSError as error:
            _send({"type": DONE, "error": f"fork server could not start a child: {error}", "leftovers": 0,
                   "retire": True})
            return None
        child.hand_over(request)  # a child forked just now: its failure to read shows as its exit
    return child


def finish_child(child, device_name: str, own_shm: bool = False):
    """Relays the child's messages until it exits, kills what it left behind (never the spare) and
    reports; the spare for the next request.

    The spare is forked once the child's first message comes (its first stage: its device is
    prepared), not when the child gets its request: in a cold batch's first wave each child is still
    making its CUDA context then, and the driver makes contexts largely one at a time (on the H200,
    16 at once took 2-3x as long each as 8), so a spare beside it would
    double the contexts the first wave waits for. A child that was a ready spare sends its first
    message at once, so later requests find their spare as early as before. Where the child sends
    nothing, the spare is forked after the child's leftovers are gone."""
    spare = None

    def start_spare(relay_fds):
        nonlocal spare
        spare = Spare.start_if_possible(device_name, close_in_child=child.own_fds() + relay_fds)

    status, cpu_s = relay_until_exit(child.pid, child.message_fd, on_first_line=start_spare)
    os.close(child.message_fd)
    child.close_pidfd()
    leftovers = kill_descendants(spare)
    message = done_message(status, cpu_s, leftovers)
    # With a process of the request left the server is replaced anyway, and that process could
    # change the tree while it is walked.
    if own_shm and (leftovers or not empty_directory(SHARED_MEMORY_DIR)):
        message["retire"] = True  # what stays there would reach the next request
    _send(message)
    return spare if spare is not None else Spare.start_if_possible(device_name)


def run_child(request: dict, prepared_at: float) -> None:
    """The spare once it has its request: the request's scratch dir and environment, then the
    evaluation, as a worker started for it would run it. The verdict profile's startup_s says how long the
    request waited for this child's device (its CUDA context; 0 when it was ready) and, where it
    waited, how long each step of that preparation took (device_context, device_clock,
    device_launch_gate, device_kernels: process.prepare_device)."""
    handed_over_at = request.pop("handed_over_at", prepared_at)
    waited = max(0.0, prepared_at - handed_over_at)
    request["startup_s"] = {"device": waited}
    if waited > 0:
        request["startup_s"].update({f"device_{step}": s for step, s in process.device_steps_s.items()})
    try:
        prctl(PR_SET_DUMPABLE, 1)  # like any worker: its own /proc entries readable as usual
        scratch = request["scratch_dir"]
        os.chdir(scratch)
        os.environ["HOME"] = os.environ["TMPDIR"] = scratch
        # The request's own Triton cache (worker_client.cpp says why none is shared): its kernels and
        # launchers are built anew in each request (Triton's driver helper is setup's: triton_helpers.py).
        os.environ["TRITON_CACHE_DIR"] = os.path.join(scratch, "triton")
        tempfile.tempdir = None  # computed again from TMPDIR
    except Exception:
        traceback.print_exc()
        os._exit(CHILD_SETUP_FAILED)
    process.evaluate(request)


def relay_until_exit(pid: int, read_fd: int, on_first_line=lambda relay_fds: None):
    """Relays the child's message lines until it exits, then what it left in the pipe (bounded: a
    grandchild holding the pipe open must not keep us here). on_first_line(descriptors of the relay's
    own) is called once the first line is relayed. (wait status, the child's own CPU s)."""
    pidfd = _pidfd(pid)
    relay = Relay(lambda: on_first_line([pidfd] if pidfd is not None else []))
    poller = select.poll()
    poller.register(read_fd, select.POLLIN)
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    pipe_open = True
    try:
        while True:
            events = dict(poller.poll(None if pidfd is not None else 20))  # no pidfd: look every 20 ms
            if pipe_open and read_fd in events:
                chunk = os.read(read_fd, 1 << 16)
                if chunk:
                    relay.feed(chunk)
                else:
                    pipe_open = False
                    poller.unregister(read_fd)
            if pidfd in events if pidfd is not None else _exited(pid):
                break
        os.set_blocking(read_fd, False)
        for _ in range(DRAIN_READS if pipe_open else 0):
            try:
                chunk = os.read(read_fd, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                break
            relay.feed(chunk)
        relay.finish()
    except TooMuchOutput:
        os.kill(pid, signal.SIGKILL)
        _send({"type": "forged_message", "why": "more messages than a worker sends"})
    if pidfd is not None:
        os.close(pidfd)
    cpu_s = own_cpu_seconds(pid)  # a zombie now: its own CPU time, without its reaped children's
    _, status = os.waitpid(pid, 0)
    return status, cpu_s


def _pidfd(pid: int):
    """A descriptor that polls readable when the child exits (Linux 5.3+), else None."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _readable(fd: int) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def _exited(pid: int) -> bool:
    """Whether the child has exited, without reaping it."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


class Relay:
    """Splits the child's bytes into lines and relays each, re-serialised."""

    def __init__(self, after_first_line=lambda: None):
        self.buffer = bytearray()
        self.scanned = 0  # no newline before this offset
        self.lines = 0
        self.after_first_line = after_first_line

    def feed(self, chunk: bytes) -> None:
        self.buffer += chunk
        while (end := self.buffer.find(b"\n", self.scanned)) >= 0:
            self._relay(bytes(self.buffer[:end]))
            del self.buffer[:end + 1]
            self.scanned = 0
        self.scanned = len(self.buffer)
        if len(self.buffer) > MAX_LINE_BYTES:
            raise TooMuchOutput()

    def finish(self) -> None:
        if self.buffer:
            self._relay(bytes(self.buffer))
            self.buffer.clear()

    def _relay(self, line: bytes) -> None:
        self.lines += 1
        if self.lines > MAX_LINES:
            raise TooMuchOutput()
        _send_line(relayed(line))
        if self.lines == 1:
            self.after_first_line()


def relayed(line: bytes) -> bytes:
    """What the supervisor gets for one line of the child's: the object as parsed here, serialised
    again, or a message it refuses (a line that does not parse here must not parse there either)."""
    try:
        message = json.loads(line)
        if not isinstance(message, dict):
            return b'{"type": "invalid_message"}'
        if message.get("type") == DONE:
            return b'{"type": "forged_message"}'
        return json.dumps(message).encode()
    except Exception:  # ValueError, RecursionError on deep nesting, ...
        return b'{"type": "invalid_message"}'


def kill_descendants(spare=None, deadline_s: float = 5.0) -> int:
    """SIGKILLs every process below this one but the spare (a Spare, while it lives) and reaps them;
    the number still there at the deadline. A process whose /proc state is Z may still run threads
    (its leader exited with SYS_exit): it is killed too, and waited for until /proc no longer lists
    it. A spare that died is reaped here like any child, and its pid is no longer spared: a
    candidate's process that came to have it is killed too."""
    me = os.getpid()
    stop = time.monotonic() + deadline_s
    while True:
        _reap_children()
        spared = spare.pid if spare is not None and spare.alive() else None
        below = [pid for pid in _descendants(me) if pid != spared]
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
        fields = _stat_fields(int(name))
        if fields:
            children.setdefault(int(fields[1]), []).append(int(name))
    found, frontier = [], [root]
    while frontier:
        kids = children.get(frontier.pop(), [])
        found += kids
        frontier += kids
    return found


def _reap_children() -> None:
    """Reaps every exited child (a spare that died too: ready_for then finds it gone)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _stat_fields(pid: int) -> list:
    """The fields of /proc/<pid>/stat after "pid (comm) ": state, ppid, ...; [] when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return []
    return stat[stat.rfind(b")") + 2:].split()


def own_cpu_seconds(pid: int) -> float:
    """utime + stime of a (zombie) process, without its children's."""
    fields = _stat_fields(pid)
    try:
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (ValueError, IndexError):
        return 0.0


def own_tmpfs(path: str) -> bool:
    """Whether `path` is a tmpfs the sandbox mounted for this server's mount namespace alone (its
    source OWN_TMPFS_SOURCE, the device `path` is on), not the host's directory, which other programs
    share and which it must never empty. The path as the sandbox mounted it: links resolved."""
    try:
        real = os.path.realpath(path)
        with open("/proc/self/mountinfo") as f:
            device = mounted_own_tmpfs(f.read(), real)
        return device is not None and os.stat(real).st_dev == device
    except OSError:
        return False


def mounted_own_tmpfs(mountinfo: str, path: str):
    """The device number of the mount in effect at `path` (the last listed there) where it is the
    sandbox's own tmpfs; None otherwise."""
    device = None
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if len(fields) > 4 and fields[4] == path and "-" in fields[5:]:
            after = fields[fields.index("-", 5) + 1:]
            major, _, minor = fields[2].partition(":")
            own = after[:2] == ["tmpfs", OWN_TMPFS_SOURCE] and major.isdigit() and minor.isdigit()
            device = os.makedev(int(major), int(minor)) if own else None
    return device


def empty_directory(path: str, mode: int = 0o1777) -> bool:
    """Makes `path` as the sandbox mounted it: empty, at `mode`, without extended attributes (a
    candidate owns the directory: it may have changed its mode, left a user.* attribute or an ACL for
    the next request to read, or a directory at mode 0 inside, and the server has no
    CAP_DAC_OVERRIDE). Whether that worked. Only once no process of the request is left: nothing
    changes the tree while it is walked (links are removed, never followed)."""
    def remove(entry: str) -> None:
        if stat.S_ISDIR(os.lstat(entry).st_mode):
            os.chmod(entry, 0o700)
            for name in os.listdir(entry):
                remove(os.path.join(entry, name))
            os.rmdir(entry)
        else:
            os.unlink(entry)

    try:
        os.chmod(path, mode)
        for name in os.listdir(path):
            remove(os.path.join(path, name))
        for name in candidates_attributes(path):
            os.removexattr(path, name)
        return not os.listdir(path) and stat.S_IMODE(os.stat(path).st_mode) == mode and not candidates_attributes(path)
    except Exception:  # OSError, RecursionError (a tree too deep), MemoryError: the server retires
        return False


def candidates_attributes(path: str) -> list:
    """The extended attributes of `path` a process without capabilities can set: user.* and POSIX
    ACLs (security.* and trusted.* need capabilities; an LSM's own label stays)."""
    return [name for name in os.listxattr(path) if name.startswith(("user.", "system.posix_acl_"))]


def done_message(status: int, cpu_s: float, leftovers: int) -> dict:
    exit_code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    cpu_limit, _ = resource.getrlimit(resource.RLIMIT_CPU)
    limited = cpu_limit != resource.RLIM_INFINITY
    limit = None
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and limited and cpu_s >= cpu_limit):
        limit = "cpu_time"  # SIGXCPU ignored: SIGKILL at the hard limit
    elif sig == signal.SIGXFSZ:
        limit = "file_size"
    own = resource.getrusage(resource.RUSAGE_SELF)
    retire = limited and own.ru_utime + own.ru_stime > cpu_limit / 2
    message = {"type": DONE, "exit_code": exit_code, "signal": sig, "cpu_s": cpu_s, "limit": limit,
               "leftovers": leftovers, "retire": retire}
    if exit_code == CHILD_SETUP_FAILED:
        message["error"] = "the fork server's child could not set up (before any candidate code)"
    return message


def _send(message: dict) -> None:
    _send_line(json.dumps(message).encode())


def _send_line(line: bytes) -> None:
    data = line + b"\n"
    while data:
        data = data[os.write(MESSAGE_FD, data):]


def prctl(option: int, value: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: nothing to set
