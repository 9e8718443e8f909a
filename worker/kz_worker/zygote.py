"""The zygote: prepares a fork server once (imports, the audit's CPU machinery), then forks fork
servers on the supervisor's request, each of which starts from that instead of importing again.

On a cold batch the supervisor starts a fork server per evaluation running at once and one per
`cuda` pre-build, ~20 interpreters importing torch (and, for evaluations, Triton and the audit's
machinery) beside nvcc on the same cores. A zygote per kind of server does those imports once.

The protocol (kz/sandbox/process.h, class Zygote) on the control socket at fd 4, one JSON object per
SOCK_SEQPACKET message: {"op": "spawn", "plan": ..., "env": ..., "fds": [...]} with descriptors,
answered by {"op": "spawned", "pid": N} or {"op": "spawn_failed", "error": ...};
{"op": "exited", ...} when a child exits (it stays a zombie until
{"op": "reap", "pid": N}); EOF ends the zygote.

Each child is the first process of a new PID namespace where the plan asks for one (unshare before
the fork; the namespace for later children is reset after it), applies its sandbox with the
supervisor's own code (libkz_zygote_child: rlimits, cgroup, network and mount namespaces, its own
/proc, chdir, no capabilities) before running anything else, and then serves as a fork server
(fork_server.serve_prepared) with the environment the supervisor gave it. The zygote keeps its
capabilities for that, runs no candidate code, is not dumpable, and no child keeps its socket.
"""
import ctypes
import json
import os
import select
import socket
import sys
import tempfile

from . import fork_server, process

CONTROL_FD = 4
CLONE_NEWPID = 0x20000000
MAX_REQUEST_BYTES = 1 << 22  # a plan lists every mount point: a few KB
MAX_FDS = 8


class Child:
    """What a forked child goes on with: the environment and device its server runs under."""

    def __init__(self, env: dict, device: str):
        self.env, self.device = env, device


def serve(device_name: str):
    """The zygote's loop; returns only in a forked child (a Child), or None when the supervisor is gone."""
    # Nobody reads the zygote's stdout while it serves: a full pipe would stop it.
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)
    process.quietly(process.prepare_host, device_name)
    fork_server.refuse_if_fork_unsafe()
    fork_server.prctl(fork_server.PR_SET_DUMPABLE, 0)
    setup = ctypes.CDLL(os.environ["KZ_ZYGOTE_LIB"], use_errno=True).kz_zygote_child_setup
    setup.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int), ctypes.c_int]
    libc = ctypes.CDLL(None, use_errno=True)
    own_pid_namespace = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    control = socket.socket(fileno=CONTROL_FD)
    zygote = Zygote(control, libc, own_pid_namespace)
    while True:
        for fd, _ in zygote.poller.poll():
            if fd == control.fileno():
                try:
                    data, fds, _, _ = socket.recv_fds(control, MAX_REQUEST_BYTES, MAX_FDS)
                except OSError:
                    return None
                if not data:
                    return None  # the supervisor is gone; its fork servers end on their stdin's EOF
                child = zygote.handle(json.loads(data), fds, setup)
                if child is not None:
                    return child
            else:
                zygote.report_exit(fd)


class Zygote:
    def __init__(self, control, libc, own_pid_namespace: int):
        self.control, self.libc, self.own_pid_namespace = control, libc, own_pid_namespace
        self.poller = select.poll()
        self.poller.register(control.fileno(), select.POLLIN)
        self.pidfds = {}     # pidfd -> pid, children still running
        self.zombies = set()  # exited, reported, not reaped yet
        self.reap_on_exit = set()

    def handle(self, request: dict, fds: list, setup):
        op = request.get("op")
        if op == "reap":
            self.reap(int(request["pid"]))
        elif op == "spawn":
            return self.spawn(request, fds, setup)
        for fd in fds:
            os.close(fd)
        return None

    def spawn(self, request: dict, fds: list, setup):
        reply = {"op": "spawned"}
        plan = request["plan"]
        if plan.get("new_pidns"):
            if self.libc.unshare(CLONE_NEWPID) != 0:
                reply["pid_namespace_error"] = f"unshare(CLONE_NEWPID): {os.strerror(ctypes.get_errno())}"
                plan["new_pidns"] = False
                self.reset_pid_namespace()  # the child must not go where an earlier one went
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as error:
            pid, reply = None, {"op": "spawn_failed", "error": f"fork: {error}"}
        if pid == 0:
            return self.become_child(request, fds, setup)
        if plan.get("new_pidns"):  # the next child gets a namespace of its own, not this one
            self.reset_pid_namespace()
        for fd in fds:
            os.close(fd)
        if pid is not None:
            pidfd = os.pidfd_open(pid)
            self.pidfds[pidfd] = pid
            self.poller.register(pidfd, select.POLLIN)
            reply["pid"] = pid
        self.send(reply)
        return None

    def reset_pid_namespace(self) -> None:
        """Children go into the zygote's own PID namespace again. Where that fails, the next child
        would be forked into the last one's namespace, beside another server's candidates: the
        zygote ends instead (the supervisor then starts servers as programs of their own)."""
        try:
            if os.stat("/proc/self/ns/pid_for_children").st_ino == os.fstat(self.own_pid_namespace).st_ino:
                return  # nothing to undo (an unshare refused for want of the capability)
        except OSError:
            pass  # before Linux 4.12: set it anyway
        if self.libc.setns(self.own_pid_namespace, CLONE_NEWPID) != 0:
            sys.stderr.write(f"kz zygote: setns to its own PID namespace: {os.strerror(ctypes.get_errno())}\n")
            os._exit(1)

    def become_child(self, request: dict, fds: list, setup):
        """In the forked child: forgets the zygote's descriptors, sets up its sandbox, takes the
        supervisor's environment for it. Never returns to the zygote's loop."""
        try:
            self.control.detach()  # closed below with every other descriptor but the child's own
            text = json.dumps(request).encode()
            array = (ctypes.c_int * len(fds))(*fds)
            if setup(text, array, len(fds)) != 0:
                raise OSError(ctypes.get_errno(), "kz_zygote_child_setup refused the request")
            os.environ.clear()
            os.environ.update(request["env"])
            tempfile.tempdir = None  # computed again from TMPDIR
            return Child(request["env"], request["env"].get("KZ_WORKER_DEVICE") or "cpu")
        except BaseException:
            import traceback
            traceback.print_exc()
            os._exit(fork_server.CHILD_SETUP_FAILED)

    def report_exit(self, pidfd: int) -> None:
        pid = self.pidfds.pop(pidfd)
        self.poller.unregister(pidfd)
        os.close(pidfd)
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        exited = info is not None and info.si_code == os.CLD_EXITED
        cpu_s = fork_server.own_cpu_seconds(pid)  # a zombie: its own CPU time
        self.send({"op": "exited", "pid": pid, "exit_code": info.si_status if exited else None,
                   "signal": None if exited or info is None else info.si_status, "cpu_s": cpu_s})
        self.zombies.add(pid)
        if pid in self.reap_on_exit:
            self.reap(pid)

    def reap(self, pid: int) -> None:
        if pid in self.zombies:
            self.zombies.discard(pid)
            self.reap_on_exit.discard(pid)
            os.waitpid(pid, 0)
        elif pid in self.pidfds.values():
            self.reap_on_exit.add(pid)  # still running (a SIGKILL on its way): reaped when it exits

    def send(self, message: dict) -> None:
        self.control.send(json.dumps(message).encode())
