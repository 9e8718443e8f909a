"""Where an evaluation's seconds go after its start-up (load_reference, compile, the audit, the trials),
function by function: each example is evaluated (untimed) in a child forked from one prepared parent,
as a fork server's child is (process.py), under cProfile. From the repository root:

  python3 bench/audit_probe.py DEVICE [--load N] [--top K] FORMAT/TASK ...

--load N: N busy processes at nice -5 beside the evaluations, as a cold batch's `cuda` pre-builds are
(kz runs them at [worker] prebuild_niceness = -5), to see what CPU contention makes of each part.
Prints each evaluation's stage seconds and parts, then the K functions with the most cumulative time
in the first example's evaluation (the one that, in a batch's first wave, pays for first calls)."""
import argparse
import cProfile
import io
import os
import pathlib
import pstats
import shutil
import sys
import tempfile
import time
import traceback
import types

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "worker"))
sys.path.insert(0, str(ROOT / "bench"))
from guard_probe import example_request  # noqa: E402
from kz_worker import process  # noqa: E402


def evaluate_in_child(device: str, example: str, top: int) -> None:
    """Forks; the child prepares its device, evaluates under cProfile, prints, exits."""
    pid = os.fork()
    if pid:
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            print(f"{example}: the probe's child failed (exit {os.waitstatus_to_exitcode(status)})", flush=True)
        return
    code = 1
    scratch = tempfile.mkdtemp(prefix="kz-audit-probe-")
    try:
        started = time.monotonic()
        process.prepare_device(device)
        prepared = time.monotonic() - started
        from kz_worker import harness
        evaluation = harness.Evaluation(example_request(device, example, scratch, trials=5),
                                        types.SimpleNamespace(stage=lambda name: None))
        profiler = cProfile.Profile()
        started = time.monotonic()
        result = profiler.runcall(evaluation.run)
        total = time.monotonic() - started
        parts = {key: {k: round(v, 3) for k, v in (result.get(key) or {}).items()}
                 for key in ("load_reference_s", "correctness_s")}
        print(f"{example}: {result['status']}, device {prepared:.3f} s, evaluation {total:.3f} s (under cProfile), "
              f"{parts}", flush=True)
        if top:
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(top)
            print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[-12000:], flush=True)
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        sys.stdout.flush()
        os._exit(code)


def busy_loops(count: int) -> list:
    pids = []
    for _ in range(count):
        pid = os.fork()
        if pid == 0:
            try:
                os.nice(-5)  # needs CAP_SYS_NICE: without it the loop runs at the probe's own priority
            except PermissionError:
                pass
            while True:
                pass
        pids.append(pid)
    return pids


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("device")
    parser.add_argument("examples", nargs="+", help="FORMAT/TASK of suite/examples")
    parser.add_argument("--load", type=int, default=0)
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    process.prepare_host(args.device)
    loads = busy_loops(args.load)
    try:
        for i, example in enumerate(args.examples):
            evaluate_in_child(args.device, example, args.top if i == 0 else 0)
    finally:
        for pid in loads:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
