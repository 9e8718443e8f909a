"""The worker's audit hook (sandbox.py). An audit hook cannot be removed, so each case runs in a fresh
interpreter: a small script installs the sandbox for a scratch dir, does one thing and prints JSON."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from kz_worker import errors
from kz_worker import verdict as v

WORKER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_sandboxed(tmp_path, body: str, enabled: bool = True) -> dict:
    """Runs `body` (as candidate code: a file in the scratch dir) after sandbox.install; returns
    {"error": the exception it raised or None, "violations": [[check, detail], ...]}."""
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    (scratch / "candidate.py").write_text("import os, shutil, socket, subprocess\n\ndef act():\n"
                                          + textwrap.indent(textwrap.dedent(body), "    ") + "\n")
    script = textwrap.dedent(f"""
        import json, os, sys
        from kz_worker import sandbox
        request = {{"device": "cpu", "scratch_dir": {str(scratch)!r},
                    "sandbox": {{"enabled": {enabled}, "writable_dirs": [], "gpu_memory_fraction": 0.9}}}}
        sandbox.install(request)
        os.chdir(request["scratch_dir"])
        sys.path.insert(0, request["scratch_dir"])
        import candidate
        try:
            candidate.act()
            error = None
        except Exception as exc:
            error = type(exc).__name__ + ": " + str(exc)
        print(json.dumps({{"error": error, "violations": sandbox.violations()}}))
    """)
    env = dict(os.environ, PYTHONPATH=WORKER_DIR, PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120,
                          start_new_session=True)  # its own process group, as the worker has
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def checks(result) -> list:
    return [check for check, _ in result["violations"]]


def test_writes_inside_scratch_are_allowed(tmp_path):
    result = run_sandboxed(tmp_path, """
        with open("inside.txt", "w") as f:
            f.write("ok")
        os.mkdir("sub")
        os.rename("inside.txt", "sub/moved.txt")
        shutil.rmtree("sub")
    """)
    assert result == {"error": None, "violations": []}


def test_write_outside_scratch_is_refused_and_recorded(tmp_path):
    target = tmp_path / "outside.txt"
    result = run_sandboxed(tmp_path, f"open({str(target)!r}, 'w').write('escaped')")
    assert result["error"].startswith("SandboxViolation")
    assert checks(result) == [v.FILESYSTEM_WRITE]
    assert not target.exists()


def test_symlink_out_of_scratch_does_not_help(tmp_path):
    target = tmp_path / "via_link.txt"
    result = run_sandboxed(tmp_path, f"""
        os.symlink({str(target)!r}, "link")   # creating the link in scratch is fine
        open("link", "w").write("escaped")   # writing through it is not
    """)
    assert checks(result) == [v.FILESYSTEM_WRITE]
    assert not target.exists()


def test_remove_outside_scratch_is_refused(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    result = run_sandboxed(tmp_path, f"os.remove({str(victim)!r})")
    assert checks(result) == [v.FILESYSTEM_WRITE]
    assert victim.exists()


def test_reading_outside_scratch_is_allowed(tmp_path):
    result = run_sandboxed(tmp_path, "open('/etc/hostname').read() if os.path.exists('/etc/hostname') else None")
    assert result == {"error": None, "violations": []}


def test_socket_connect_is_refused(tmp_path):
    # 127.0.0.1, port 9 (discard): refused by the hook before any packet is sent.
    result = run_sandboxed(tmp_path, "socket.create_connection(('127.0.0.1', 9), timeout=1)")
    assert checks(result) == [v.NETWORK_ACCESS]
    assert "SandboxViolation" in result["error"]


def test_candidate_subprocess_is_recorded_not_refused(tmp_path):
    result = run_sandboxed(tmp_path, "subprocess.run(['true'], check=True)")
    assert result["error"] is None
    assert checks(result) == [v.PROCESS_SPAWN]


def test_library_subprocess_is_not_recorded(tmp_path):
    # torch runs the compiler itself (subprocess from site-packages code): not the candidate's spawn.
    result = run_sandboxed(tmp_path, """
        import torch.utils.cpp_extension as ext
        ext.get_compiler_abi_compatibility_and_version('c++')
    """)
    assert v.PROCESS_SPAWN not in checks(result)


def test_exec_is_refused(tmp_path):
    result = run_sandboxed(tmp_path, "os.execv('/bin/true', ['true'])")
    assert checks(result) == [v.PROCESS_SPAWN]
    assert "SandboxViolation" in result["error"]


def test_signal_outside_the_group_is_refused_inside_is_not(tmp_path):
    result = run_sandboxed(tmp_path, "os.kill(os.getppid(), 0)")
    assert checks(result) == [v.PROCESS_SIGNAL]
    result = run_sandboxed(tmp_path, "os.kill(os.getpid(), 0)")
    assert result == {"error": None, "violations": []}


# Each way into the worker's own objects, tried by candidate code; act() fails with the ones that got through.
# (threading.settrace only reaches threads started later: the Guard's settings and the background-thread
# check cover it.)
REACHING_FOR_THE_HARNESS = {
    "gc.get_objects, name built up": "getattr(__import__('gc'), 'get_' + 'objects')()",
    "gc.get_referrers": "import gc; gc.get_referrers(REACHING)",
    "gc.get_referents": "import gc; gc.get_referents(REACHING)",
    "sys._getframe": "import sys; sys._getframe(0).f_back",
    "inspect.currentframe": "import inspect; inspect.currentframe()",
    "inspect.stack": "import inspect; inspect.stack()",
    "traceback.walk_stack": "import traceback; next(traceback.walk_stack(None))",
    "a traceback's frame": "try:\n    1 / 0\nexcept ZeroDivisionError as exc:\n    exc.__traceback__.tb_frame",
    "traceback.walk_tb": "import sys, traceback\ntry:\n    1 / 0\nexcept ZeroDivisionError:\n"
                         "    next(traceback.walk_tb(sys.exc_info()[2]))",
    "a generator's frame": "(i for i in ()).gi_frame",
    "sys._current_frames": "import sys; sys._current_frames()",
    "sys.settrace": "import sys; sys.settrace(None)",
    "sys.setprofile": "import sys; sys.setprofile(None)",
}

# What the standard library does with frames for its own ends, for honest code: never refused.
HONEST_USES_OF_FRAMES = """
    import collections, enum, logging, traceback, typing, warnings, dataclasses
    Point = collections.namedtuple("Point", "x y")
    class Pair(typing.NamedTuple):
        a: int
    T = typing.TypeVar("T")
    Color = enum.Enum("Color", "RED GREEN")
    @dataclasses.dataclass
    class Box:
        w: int = 1
    logging.getLogger("candidate").warning("a message with its caller's line")
    warnings.warn("a warning")
    try:
        1 / 0
    except ZeroDivisionError:
        text = traceback.format_exc()
        logging.getLogger("candidate").exception("and its traceback")
    traceback.extract_stack()
    traceback.format_stack()
    assert "ZeroDivisionError" in text and Point(1, 2).x == 1 and Box().w == 1
"""


def test_reaching_for_the_workers_objects_is_refused(tmp_path):
    attempts = "".join(f"""
        try:
            exec({code!r}, {{"REACHING": object()}})
            got_through.append({name!r})
        except PermissionError:
            pass
    """ for name, code in REACHING_FOR_THE_HARNESS.items())
    result = run_sandboxed(tmp_path, "got_through = []\n" + textwrap.dedent(attempts)
                           + "\nif got_through:\n    raise RuntimeError('got through: ' + ', '.join(got_through))")
    assert result["error"] is None
    assert set(checks(result)) == {v.HARNESS_ACCESS}


def test_the_standard_librarys_own_uses_of_frames_are_not_refused(tmp_path):
    result = run_sandboxed(tmp_path, HONEST_USES_OF_FRAMES)
    assert result == {"error": None, "violations": []}


def test_library_code_may_walk_frames_and_the_object_graph_outside_the_candidate(tmp_path):
    # torch's own code, called by the candidate, takes frames for its own ends (a library, not the candidate).
    result = run_sandboxed(tmp_path, """
        import torch
        torch.fx.symbolic_trace(torch.nn.ReLU())
    """)
    assert result == {"error": None, "violations": []}


def test_writes_to_the_guards_functions_are_refused_whoever_makes_them(tmp_path):
    # With the hook the Guard reads none of its functions' code (each read an audited event): the hook
    # refuses every write to it instead, also from code compiled under a library's file name.
    result = run_sandboxed(tmp_path, """
        import torch
        from kz_worker import cheats, correctness
        guard = cheats.Guard("triton")
        assert guard.codes_protected
        function, code = correctness.compare_outputs, correctness.compare_outputs.__code__
        agree = (lambda out, ref, settings: {}).__code__
        library_file = torch.__file__  # the frame looks like torch's own
        attempts = {
            "__code__": lambda: setattr(function, "__code__", agree),
            "__defaults__ via object.__setattr__": lambda: object.__setattr__(function, "__defaults__", (1,)),
            "del __kwdefaults__": lambda: delattr(function, "__kwdefaults__"),
            "from a library's file name": lambda: exec(compile("f.__code__ = c", library_file, "exec"),
                                                         {"f": function, "c": agree}),
        }
        got_through = []
        for name, attempt in attempts.items():
            try:
                attempt()
                got_through.append(name)
            except PermissionError:
                pass
        def own(x=1):
            return x
        own.__defaults__ = (2,)  # the candidate's own functions are its own
        assert own() == 2 and function.__code__ is code and guard.changes() == []
        # The hook's state is within reach: a write made with it turned off is left unread inside
        # the timing's hold, and caught (and undone) by every other verify.
        from kz_worker import sandbox
        sandbox._busy.active = True
        function.__code__ = agree
        sandbox._busy.active = False
        assert guard.changes(in_hold=True) == []
        assert guard.changes() == ["kz_worker.correctness.compare_outputs.__code__"] and function.__code__ is code
        if got_through:
            raise RuntimeError("got through: " + ", ".join(got_through))
    """)
    assert result["error"] is None
    assert set(checks(result)) == {v.HARNESS_PATCHED}
    assert any("kz_worker.correctness.compare_outputs.__code__" in detail for _, detail in result["violations"])


def test_disabled_sandbox_installs_nothing(tmp_path):
    target = tmp_path / "outside.txt"
    result = run_sandboxed(tmp_path, f"open({str(target)!r}, 'w').write('fine')", enabled=False)
    assert result == {"error": None, "violations": []}
    assert target.exists()


def test_apply_replaces_the_verdict():
    from kz_worker import sandbox
    result = {"status": v.RUNTIME_ERROR, "correct": False, "checks": [v.FORWARD_FAILED], "message": "boom"}
    sandbox._violations[:] = [(v.NETWORK_ACCESS, "socket.connect to ('1.2.3.4', 53)")]
    try:
        sandbox.apply(result)
    finally:
        sandbox._violations.clear()
    assert result["status"] == v.SANDBOX_VIOLATION
    assert result["checks"] == [v.NETWORK_ACCESS]
    assert "socket.connect" in result["message"] and "boom" in result["message"]


@pytest.mark.parametrize("check", [v.HARNESS_ACCESS, v.HARNESS_PATCHED])
def test_apply_makes_reaching_for_the_harness_a_cheat(check):
    from kz_worker import sandbox
    result = {"status": v.OK, "correct": True, "checks": [], "message": ""}
    sandbox._violations[:] = [(v.FILESYSTEM_WRITE, "writing /etc/x"), (check, "gc.get_objects")]
    try:
        sandbox.apply(result)
    finally:
        sandbox._violations.clear()
    assert result["status"] == v.CHEAT_DETECTED and not result["correct"]
    assert result["checks"] == [v.FILESYSTEM_WRITE, check]
    assert result["message"].startswith("cheat detected: ")


@pytest.mark.parametrize("exc, expected", [
    (MemoryError(), (v.RUNTIME_ERROR, v.MEMORY_LIMIT)),
    (RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: you tried "
                  "to allocate 68719476736 bytes."), (v.RUNTIME_ERROR, v.MEMORY_LIMIT)),
    (OSError(27, "File too large"), (v.SANDBOX_VIOLATION, v.FILE_SIZE_LIMIT)),
    (ValueError("plain"), (v.RUNTIME_ERROR, v.FORWARD_FAILED)),
])
def test_resource_exceptions_are_classified(exc, expected):
    assert errors.classify_exception(exc, "correctness") == expected


def failed_build(message: str, returncode: int) -> RuntimeError:
    """torch's load_inline failure: RuntimeError("Error building extension ...") from ninja's exit."""
    import subprocess
    try:
        try:
            raise subprocess.CalledProcessError(returncode, ["ninja", "-v"])
        except subprocess.CalledProcessError as ninja:
            raise RuntimeError(f"Error building extension 'op': {message}") from ninja
    except RuntimeError as exc:
        return exc


@pytest.mark.parametrize("exc, expected", [
    (failed_build("cuda.cu(12): error: identifier \"x\" is undefined", 1), (v.COMPILE_ERROR, v.KERNEL_COMPILE)),
    # ninja's status alone says nothing (kz-nvcc ending a failed build's other steps gives 137 too)
    (failed_build("", 137), (v.COMPILE_ERROR, v.KERNEL_COMPILE)),
    (failed_build("nvcc error   : 'cicc' died due to signal 9 (Kill signal)", 1), (v.INFRA_ERROR, v.BUILD_KILLED)),
    (failed_build("g++: fatal error: Killed signal terminated program cc1plus", 1), (v.INFRA_ERROR, v.BUILD_KILLED)),
    (failed_build("nvcc error   : 'cicc' died due to signal 11 (Invalid memory reference)", 1),
     (v.COMPILE_ERROR, v.KERNEL_COMPILE)),  # a compiler crash on this source: the candidate's
    # A real error: kz-nvcc ends the build's other steps, whose SIGKILL ninja then reports (exit 137).
    (failed_build("cuda.cu(10): error: expected a \";\"\nkz-nvcc: this compile failed, so the build's other "
                  "steps are ended\nFAILED: [code=137] main.o", 137), (v.COMPILE_ERROR, v.KERNEL_COMPILE)),
    (failed_build("main.cpp:3:5: error: 'x' was not declared\nnvcc error   : 'cicc' died due to signal 9", 1),
     (v.COMPILE_ERROR, v.KERNEL_COMPILE)),
])
def test_a_build_killed_by_sigkill_is_the_machines_not_the_kernels(exc, expected):
    assert errors.classify_exception(exc, "compile") == expected


def test_the_harness_failing_to_make_a_gpu_lock_file_records_no_violation(tmp_path):
    # The supervisor makes the lock files; one missing where it cannot be made (a read-only mount;
    # here a path under a file) is the machine's infra_error, not the candidate's sandbox_violation.
    (tmp_path / "a-file").write_text("")
    result = run_sandboxed(tmp_path, f"""
        from kz_worker.gpu_lock import GpuLock
        GpuLock({str(tmp_path / "a-file" / "locks")!r}, "GPU-x")
    """)
    assert result["error"].startswith("LockFileMissing"), result
    assert result["violations"] == []
