"""A stand-in for `kz eval-suite` for the benchmark's own tests: one verdict per candidate file,
its status from the batch's file name (<format>__<kind>.py), written as kz writes results.jsonl."""
import argparse
import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "suite"))
from candidate_variants import EXPECTED  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("command")
parser.add_argument("--suite")
parser.add_argument("--candidates")
parser.add_argument("--device")
parser.add_argument("--out")
parser.add_argument("--format", default="auto")
parser.add_argument("--trials")
parser.add_argument("--no-cache", action="store_true")
args = parser.parse_args()
time.sleep(0.2)  # the start-up: wall time outside every evaluation
batch_started = time.monotonic()
with open(args.out, "w") as out:
    for index, path in enumerate(sorted(pathlib.Path(args.candidates).rglob("*.py"))):
        fmt, _, kind = path.stem.partition("__")
        status = EXPECTED.get(kind, "ok")
        task = path.parent.name if path.parent != pathlib.Path(args.candidates) else path.stem
        timed = status == "ok" and args.device != "cpu"
        default_format = "cuda-rtc" if args.format == "auto" else args.format
        verdict = {"task_id": task, "candidate": str(path), "format": fmt if kind else default_format,
                   "status": status, "checks": [],
                   "speedup": 1.25 if timed else None, "runtime_ms": 0.08 if timed else None,
                   "ref_runtime_ms": 0.1 if timed else None,
                   "profile": {"wall_s": 0.05, "started_s": 0.2 + 0.05 * index,
                               "stage_s": {"startup": 0.02, "load_reference": 0.01, "compile": 0.01,
                                           "correctness": 0.01},
                               "cpu_s": {"worker": 0.04, "subprocesses": 0.0}}}
        if verdict["format"] == "cuda" and args.device != "cpu" and status != "compile_error":
            # kz pre-builds cuda candidates on a GPU, all at once from its start; a failed build is the verdict
            verdict["profile"].update(prebuild_s=0.1, prebuild_started_s=0.2, prebuild_cpu_s=0.3)
        time.sleep(0.05)
        out.write(json.dumps(verdict) + "\n")
phases = {"setup": 0.2, "batch": time.monotonic() - batch_started, "shutdown": 0.0, "servers_ended": 0}
pathlib.Path(args.out).with_suffix(".summary.json").write_text(json.dumps({"phases_s": phases}))
print("fake kz: done")
