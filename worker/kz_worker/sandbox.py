"""The worker's own layer of the sandbox, installed before any reference or candidate code runs
(request["sandbox"], made by eval/src/sandbox.cpp). The OS-level layer (resource limits, the process
cap, no network namespace, read-only mounts, no capabilities) is set up by the supervisor before the
worker starts; docs/evaluation.md ("Sandbox") has the table of what is enforced by what.

Here, inside the worker process:

  An audit hook (sys.addaudithook, PEP 578) that
    refuses  writes outside the scratch dir, /dev/shm and a few devices: open()
             for writing, os.remove / rename / rmdir / mkdir / symlink / link / truncate / chmod /
             chown / utime / setxattr, shutil.rmtree / copyfile / copytree / move ...  filesystem_write
    refuses  socket connect / sendto / sendmsg, whatever the address family          network_access
    refuses  os.exec* (the worker replaced by another program)                        process_spawn
    refuses  os.kill / os.killpg of processes outside the worker's process group, and
             of its parent (the supervisor, or the fork server that forked it)       process_signal
    records  processes the candidate's own code starts (os.fork, os.system,
             subprocess.Popen, os.posix_spawn, os.spawn*), without refusing them: they still run
             inside the OS-level limits and die with the process group               process_spawn
    refuses  the audited ways into the worker's own objects (the precomputed reference outputs,
             the evaluation's state), which the static scan can only see when they are spelled out:
             the garbage collector's object graph (gc.get_objects / get_referrers / get_referents),
             stack frames (sys._getframe, sys._current_frames, a traceback's tb_frame, a
             generator's or coroutine's frame, inspect's and traceback.walk_*'s frames), and trace
             and profile hooks (sys.settrace / setprofile)                             harness_access
    refuses  writes to the __code__, __defaults__ or __kwdefaults__ of the functions the harness's
             Guard watches (protect_functions), from any code: the Guard then need not read ~1,000
             of them per verify, each read an audited event                            harness_patched
             (either way the verdict is then cheat_detected, not sandbox_violation)
  What torch and Triton start themselves (ninja, nvcc, ptxas, gcc, ldconfig) is not the candidate's:
  process events count as the candidate's only when the innermost Python frame outside the standard
  library lies outside site-packages and this worker (the candidate's file, exec'd strings). A frame
  counts as handed to the candidate only when candidate code asked for it itself or through inspect
  or traceback.walk_*: the standard library's own uses (collections.namedtuple, typing, logging,
  traceback.format_exc) take a frame and give back names or text. The object graph is refused
  whenever candidate code is on the stack.

  torch.cuda.set_per_process_memory_fraction(gpu_memory_fraction) on a GPU, and SIGXFSZ back to its
  default action (Python ignores it), so a write past the file size limit kills the worker and the
  supervisor can name the limit.

A refused operation raises SandboxViolation (a PermissionError). Caught or not, every violation is
recorded, and apply() turns the verdict into sandbox_violation with its checks (cheat_detected when
one is harness_access or harness_patched).

Not a security boundary: the hook sees only what Python code does through audited APIs. C code (a
load_inline extension, ctypes; the CPython API reaches every object and frame) bypasses it, a signal
handler is handed the interrupted frame without any audited call, os.open(..., dir_fd=) is not
resolved, a symlink swapped between the check and the open races it, and a candidate in the same
interpreter can reach the hook's state. The OS-level limits are what hold against those.
"""
import contextlib
import errno
import os
import signal
import sys
import sysconfig
import threading

from . import verdict as v

MAX_RECORDED = 20  # a fork bomb must not grow the list without bound


class SandboxViolation(PermissionError):
    """An operation the sandbox refuses."""


_violations = []  # (check, detail), first occurrence of each, in order
_busy = threading.local()  # the hook's own calls (realpath, readlink) must not re-enter it
_write_roots = ()  # realpaths of the directories writes may go to
_library_dirs = ()  # site-packages and this worker: their process spawns are not the candidate's
_stdlib_dirs = ()
_installed = False
_protected_functions = set()  # ids of the functions whose code writes are refused (protect_functions)

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_WRITABLE_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/stdout", "/dev/stderr",
                     "/dev/random", "/dev/urandom")
_WRITABLE_PREFIXES = ("/dev/fd/", "/proc/self/fd/")

# Path-changing events: (path argument, its dir_fd argument or None), for each path argument.
_PATH_EVENTS = {
    "os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.mkdir": ((0, 2),),
    "os.rename": ((0, 2), (1, 3)), "os.symlink": ((1, 2),), "os.link": ((1, 3),),
    "os.truncate": ((0, None),), "os.chmod": ((0, 2),), "os.chown": ((0, 3),), "os.utime": ((0, 3),),
    "os.chflags": ((0, None),), "os.setxattr": ((0, None),), "os.removexattr": ((0, None),),
    "shutil.rmtree": ((0, 1),), "shutil.copyfile": ((1, None),), "shutil.copymode": ((1, None),),
    "shutil.copystat": ((1, None),), "shutil.copytree": ((1, None),), "shutil.move": ((0, None), (1, None)),
    "shutil.chown": ((0, None),), "shutil.unpack_archive": ((1, None),), "shutil.make_archive": ((0, None),),
}
_SOCKET_EVENTS = ("socket.connect", "socket.sendto", "socket.sendmsg")
_SPAWN_EVENTS = ("os.fork", "os.forkpty", "os.system", "os.posix_spawn", "os.spawn", "subprocess.Popen")
_SIGNAL_EVENTS = ("os.kill", "os.killpg")
# The audited ways into the worker's own objects (the module docstring says which count when).
_OBJECT_GRAPH_EVENTS = ("gc.get_objects", "gc.get_referrers", "gc.get_referents")
_FRAME_ATTRIBUTES = frozenset(("tb_frame", "gi_frame", "cr_frame", "ag_frame"))
# Not ctypes: its casts read any address unaudited, so refusing its audited calls would be a speed
# bump, and the sandbox's own tests use it to reach past this hook to the OS-level layer.
_TRACE_EVENTS = ("sys._current_frames", "sys._current_exceptions", "sys.settrace", "sys.setprofile")
_FUNCTION_STATE = frozenset(("__code__", "__defaults__", "__kwdefaults__"))
_FUNCTION_WRITES = ("object.__setattr__", "object.__delattr__")
# object.__getattr__ and the writes are left out: the former comes for every function's __code__ read
# (torch's own, inspect's), the latter for every class attribute set, and only a frame attribute or a
# protected function is looked at (_hook).
_WATCHED = frozenset(("open", "os.exec", "sys._getframe") + tuple(_PATH_EVENTS) + _SOCKET_EVENTS + _SPAWN_EVENTS
                     + _SIGNAL_EVENTS + _OBJECT_GRAPH_EVENTS + _TRACE_EVENTS)


def install(request: dict) -> None:
    """Sets up the worker's layer for `request` (nothing without request["sandbox"]["enabled"])."""
    config = request.get("sandbox") or {}
    if not config.get("enabled"):
        return
    import torch  # before the hook: torch's own import needs no auditing
    fraction = float(config.get("gpu_memory_fraction") or 0)
    device = torch.device(request.get("device", "cpu"))
    if device.type == "cuda" and 0 < fraction < 1:
        torch.cuda.set_per_process_memory_fraction(fraction, device)
    if hasattr(signal, "SIGXFSZ"):
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)

    global _write_roots, _library_dirs, _stdlib_dirs
    roots = [request["scratch_dir"], *config.get("writable_dirs", ())]
    _write_roots = tuple(sorted({os.path.realpath(r) for r in roots}))
    worker_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = sysconfig.get_paths()
    library = {paths.get("purelib"), paths.get("platlib"), worker_dir}
    library |= {os.path.realpath(p) for p in library if p}
    _library_dirs = tuple(_as_dir(p) for p in library if p)
    stdlib = {paths.get("stdlib"), paths.get("platstdlib")}
    stdlib |= {os.path.realpath(p) for p in stdlib if p}
    _stdlib_dirs = tuple(_as_dir(p) for p in stdlib if p)
    global _installed
    sys.addaudithook(_hook)
    _installed = True


def protect_functions(functions) -> bool:
    """With the hook installed, refuses every later write to these functions' __code__, __defaults__
    and __kwdefaults__ (harness_patched), whoever makes it: nothing of the worker's changes them, and
    a library's frame is easy to fake (code compiled under its file name). The caller must keep the
    functions alive (their ids are remembered). False without the hook: the caller must check them."""
    if not _installed:
        return False
    _protected_functions.update(id(function) for function in functions)
    return True


@contextlib.contextmanager
def unaudited():
    """The block with the hook off in this thread: the hook's own calls (realpath, readlink), and the
    harness's own writes it would refuse (the Guard restoring a function's code)."""
    previous = getattr(_busy, "active", False)
    _busy.active = True
    try:
        yield
    finally:
        _busy.active = previous


def violations() -> list:
    """The (check, detail) pairs recorded so far."""
    return list(_violations)


def summary() -> str:
    """The first violations recorded, for a message ("" when none)."""
    details = "; ".join(detail for _, detail in _violations[:5])
    if len(_violations) > 5:
        details += f"; and {len(_violations) - 5} more"
    return details


def apply(result: dict) -> None:
    """Turns a verdict into sandbox_violation when anything was recorded (the sandbox's checks
    replace the consequential ones, such as forward_failed for a refused connect), or into
    cheat_detected when candidate code reached for the worker's own objects."""
    if not _violations:
        return
    checks = []
    for check, _ in _violations:
        if check not in checks:
            checks.append(check)
    cheat = v.HARNESS_ACCESS in checks or v.HARNESS_PATCHED in checks
    message = f"{'cheat detected' if cheat else 'sandbox violation'}: {summary()}"
    if result.get("status") not in (None, v.OK) and result.get("message"):
        message += f"\nthe evaluation then ended with {result['status']}: {result['message']}"
    result.update(status=v.CHEAT_DETECTED if cheat else v.SANDBOX_VIOLATION, correct=False, checks=checks,
                  message=message)


# ---- the hook --------------------------------------------------------------------------------------

def _hook(event, args):
    if event not in _WATCHED:  # then only a frame attribute read, or a protected function's code written
        if event == "object.__getattr__":
            if args[1] not in _FRAME_ATTRIBUTES:
                return
        elif event not in _FUNCTION_WRITES or args[1] not in _FUNCTION_STATE or id(args[0]) not in _protected_functions:
            return
    if getattr(_busy, "active", False):
        return
    with unaudited():
        _check(event, args)


def _record(check: str, detail: str, refuse: bool) -> None:
    if len(_violations) < MAX_RECORDED and (check, detail) not in _violations:
        _violations.append((check, detail))
    if refuse:
        raise SandboxViolation(errno.EPERM, f"kz sandbox: {detail} is not allowed")


def _check(event, args):
    if event == "open":
        path, mode, flags = args
        writing = (flags or 0) & _WRITE_FLAGS or (isinstance(mode, str) and any(c in mode for c in "wax+"))
        if writing and not _writable(path, None):
            _record(v.FILESYSTEM_WRITE, f"writing {_show(path)}", refuse=True)
    elif event in _PATH_EVENTS:
        for path_index, fd_index in _PATH_EVENTS[event]:
            path = args[path_index] if path_index < len(args) else None
            dir_fd = args[fd_index] if fd_index is not None and fd_index < len(args) else None
            if path is not None and not _writable(path, dir_fd):
                _record(v.FILESYSTEM_WRITE, f"{event} on {_show(path)}", refuse=True)
    elif event in _SOCKET_EVENTS:
        address = args[1] if len(args) > 1 else None
        if address is not None or event == "socket.connect":
            _record(v.NETWORK_ACCESS, f"{event} to {address!r}", refuse=True)
    elif event == "os.exec":
        if _from_candidate():
            _record(v.PROCESS_SPAWN, f"os.exec* of {_show(args[0])}", refuse=True)
    elif event in _SPAWN_EVENTS:
        if _from_candidate():
            what = {"subprocess.Popen": lambda: f"subprocess.Popen of {_show(args[1] if len(args) > 1 else args[0])}",
                    "os.system": lambda: f"os.system({_show(args[0])})",
                    "os.posix_spawn": lambda: f"os.posix_spawn of {_show(args[0])}",
                    "os.spawn": lambda: f"os.spawn* of {_show(args[1])}"}.get(event, lambda: event)()
            _record(v.PROCESS_SPAWN, what, refuse=False)
    elif event in _OBJECT_GRAPH_EVENTS:
        if _candidate_on_stack():
            _record(v.HARNESS_ACCESS, f"{event} (the garbage collector's object graph)", refuse=True)
    elif event in ("sys._getframe", "object.__getattr__"):  # the latter only for a frame attribute (_hook)
        if _frame_for_candidate():
            what = event if event == "sys._getframe" else f"the {args[1]} of a {type(args[0]).__name__}"
            _record(v.HARNESS_ACCESS, f"{what} (stack frames)", refuse=True)
    elif event in _FUNCTION_WRITES:  # a protected function's code (_hook)
        function = args[0]
        name = f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', '?')}.{args[1]}"
        _record(v.HARNESS_PATCHED, f"a write to {name} (a function the harness relies on)", refuse=True)
    elif event in _TRACE_EVENTS:
        if _from_candidate():
            _record(v.HARNESS_ACCESS, event, refuse=True)
    elif event in _SIGNAL_EVENTS:
        target, sig = args[0], args[1]
        if not _own_group(target, event == "os.killpg") and _from_candidate():
            _record(v.PROCESS_SIGNAL, f"{event}({target}, {sig}) outside the worker's process group or to its parent",
                    refuse=True)


def _as_dir(path: str) -> str:
    return path.rstrip("/") + "/"


def _show(value, limit: int = 200) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _writable(path, dir_fd) -> bool:
    if isinstance(path, int):
        return True  # an open descriptor: its open was checked
    try:
        text = os.fsdecode(os.fspath(path))
    except TypeError:
        return False
    if text in _WRITABLE_DEVICES or text.startswith(_WRITABLE_PREFIXES):
        return True
    if not os.path.isabs(text) and isinstance(dir_fd, int) and dir_fd >= 0:
        try:
            text = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), text)
        except OSError:
            return False
    resolved = os.path.realpath(text)  # relative to the cwd (the scratch dir); symlinks followed
    return any(resolved == root or resolved.startswith(root + "/") for root in _write_roots)


def _own_group(target: int, is_group: bool) -> bool:
    """Whether a signal to `target` stays among the worker's own processes: its process group, but
    never its parent (the supervisor, or the fork server, which shares the group)."""
    own = os.getpgid(0)
    parent = os.getppid()  # 0 for the first process of a PID namespace: its parent is outside
    if parent and target == parent:
        return False
    if is_group:
        return target in (0, own)
    if target in (0, os.getpid()):
        return True
    if target == -1:
        return False
    if target < -1:
        return -target == own
    try:
        return os.getpgid(target) == own
    except OSError:
        return True  # no such process: the signal goes nowhere


def _origin(frame) -> str:
    """Whose code `frame` runs: "hook" (this module), "stdlib", "library" (site-packages, this worker)
    or "candidate" (anything else: the candidate's file, the reference's, exec'd strings)."""
    name = frame.f_code.co_filename
    if name == __file__:
        return "hook"
    if name.startswith("<frozen") or (name.startswith(_stdlib_dirs) and not name.startswith(_library_dirs)):
        return "stdlib"
    return "library" if name.startswith(_library_dirs) else "candidate"


def _first_frame_not(skipped):
    """The innermost frame below this module's for which skipped(frame) is false, or None."""
    frame = sys._getframe(1)
    while frame is not None and (_origin(frame) == "hook" or skipped(frame)):
        frame = frame.f_back
    return frame


def _is_candidate(frame) -> bool:
    return frame is not None and _origin(frame) == "candidate"


def _from_candidate() -> bool:
    """Whether the innermost frame outside the standard library (and this module) is candidate code
    (else the interpreter's own machinery, or a library's)."""
    return _is_candidate(_first_frame_not(lambda frame: _origin(frame) == "stdlib"))


def _candidate_on_stack() -> bool:
    return _first_frame_not(lambda frame: _origin(frame) != "candidate") is not None


def _hands_out_frames(frame) -> bool:
    """The standard library's functions that give their caller frame objects."""
    name = os.path.basename(frame.f_code.co_filename)
    return name == "inspect.py" or (name == "traceback.py" and frame.f_code.co_name in ("walk_stack", "walk_tb"))


def _frame_for_candidate() -> bool:
    """Whether the frame being taken goes to candidate code: it takes it itself, or through
    inspect or traceback.walk_* (a generator's f_back is the code that resumed it)."""
    return _is_candidate(_first_frame_not(lambda frame: _origin(frame) == "stdlib" and _hands_out_frames(frame)))
