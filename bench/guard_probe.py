"""The harness Guard's cost per verify (it runs after every timed run, inside the timing's exclusive
GPU hold), part by part, in a process prepared as a worker is (process.py). From the repository root:

  python3 bench/guard_probe.py DEVICE [--no-freeze] [--sandbox] [--evaluate FORMAT/TASK ...]

cpu: with TRITON_INTERPRET=1. --no-freeze prepares without process.freeze_heap, as workers did
before it. --evaluate first runs a real evaluation (untimed) of suite/examples/FORMAT/TASK.py against
its kzbench task and probes the Guard that evaluation used, after the candidate's import, audit and
trials; several may be given (each in the same process, one after the other). --sandbox installs the
sandbox's audit hook first, as every worker has it: it sees each function's __code__ read, and with it the
Guard leaves the functions' code to the hook inside the timing's exclusive hold, where the hook refuses
writes to it (the probe still times reading it)."""
import argparse
import pathlib
import sys
import time
import types

sys.path.insert(0, "worker")
from kz_worker import process  # noqa: E402

RUNS = 300
ROOT = pathlib.Path(__file__).resolve().parent.parent
TOLERANCE = {"atol_fp32": 1e-4, "rtol_fp32": 1e-4, "norm_tol_fp32": 1e-3,
             "atol_half": 1e-2, "rtol_half": 1e-2, "norm_tol_half": 2e-2}


def per_call_us(function) -> float:
    start = time.perf_counter()
    for _ in range(RUNS):
        function()
    return (time.perf_counter() - start) / RUNS * 1e6


def example_request(device: str, example: str, scratch, trials: int) -> dict:
    """An untimed request for suite/examples/<FORMAT/TASK>.py against its kzbench task (also
    bench/audit_probe.py's)."""
    fmt, task = example.split("/")
    return {"device": device, "format": fmt, "seed": 7, "trials": trials, "scratch_dir": str(scratch),
            "reference_source": next((ROOT / "suite" / "kzbench").glob(f"level*/{task}.py")).read_text(),
            "candidate_source": (ROOT / "suite" / "examples" / fmt / f"{task}.py").read_text(),
            "timing": {"enabled": False}, "tolerance": TOLERANCE}


def evaluated_guard(device: str, example: str):
    """The Guard of a real evaluation of suite/examples/<example>.py, once it has run."""
    from kz_worker import harness
    scratch = pathlib.Path("/tmp") / f"kz-guard-probe-{example.replace('/', '-')}"
    scratch.mkdir(exist_ok=True)
    request = example_request(device, example, scratch, trials=1)
    evaluation = harness.Evaluation(request, types.SimpleNamespace(stage=lambda name: None))
    result = evaluation.run()
    print(f"{example}: {result['status']}")
    return evaluation.guard


def probe(label: str, guard) -> None:
    from kz_worker import cheats

    def codes():
        for _, function, code, defaults, kwdefaults in guard.codes:
            _ = (function.__code__ is code, function.__defaults__ is defaults, function.__kwdefaults__ is kwdefaults)

    def classes():
        for _, cls, keys in guard.class_keys:
            _ = set(vars(cls)) - keys

    def settings():
        for setting, value in guard.settings:
            cheats._same(setting.get(), value)

    print(f"{label}: {len(guard.entries)} watched names, {len(guard.codes)} functions, "
          f"{len(guard.class_keys)} classes, {len(guard.settings)} settings, {len(guard.modules)} modules"
          + ("; functions' code guarded by the audit hook, not read by a verify in the hold"
             if guard.codes_protected else ""))
    for name, function in [("verify, first calls", lambda: guard.verify("probe")),
                           ("verify", lambda: guard.verify("probe")),
                           ("verify, in the hold", lambda: guard.verify("probe", in_hold=True)),
                           ("names (identity check)", lambda: cheats._identities_unchanged(guard.identities)),
                           ("functions' code", codes), ("classes' keys", classes), ("settings", settings),
                           ("modes", cheats.active_modes)]:
        print(f"  {name:24s} {per_call_us(function):8.1f} µs")
    for setting, value in guard.settings:
        print(f"    setting {setting.name:40s} {per_call_us(lambda: cheats._same(setting.get(), value)):8.1f} µs")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("device", nargs="?", default="cpu")
    parser.add_argument("--no-freeze", action="store_true")
    parser.add_argument("--evaluate", action="append", default=[], metavar="FORMAT/TASK")
    parser.add_argument("--sandbox", action="store_true")
    args = parser.parse_args()
    if args.no_freeze:
        process.freeze_heap = lambda: None
    process.prepare_host(args.device)
    process.prepare_device(args.device)
    if args.sandbox:
        from kz_worker import sandbox
        scratch = pathlib.Path("/tmp") / "kz-guard-probe-sandbox"
        scratch.mkdir(exist_ok=True)
        sandbox.install({"device": args.device, "scratch_dir": str(scratch),
                         "sandbox": {"enabled": True, "writable_dirs": [], "gpu_memory_fraction": 0}})
    if not args.evaluate:
        from kz_worker import cheats
        cheats.install_launch_hooks("cuda")
        probe(f"{args.device}{' (heap not frozen)' if args.no_freeze else ''}"
              f"{' (audit hook installed)' if args.sandbox else ''}", cheats.Guard("cuda"))
    for example in args.evaluate:
        probe(f"{args.device}, after evaluating {example}", evaluated_guard(args.device, example))


if __name__ == "__main__":
    main()
