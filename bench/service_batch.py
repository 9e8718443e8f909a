#!/usr/bin/env python3
"""Evaluation throughput through `kz serve-eval`, the way an RL trainer uses kz: one service, batches
submitted over HTTP, verdicts streamed back.

    bench/service_batch.py --out OUTDIR [--kz build/kz] [--device cuda:0] [--rounds 2]
                           [--formats cuda,cuda-rtc,triton] [--limit N] [--kb-from compare.json]

The fixed batch of bench/make_eval_batch.py (34 candidates) goes to one service `--rounds` times,
each round in other bytes (a salt in every kernel's source), so every round builds and evaluates
everything afresh: no verdict cache (--no-cache) and empty compile caches at the start.
  round 1   submitted as soon as the service listens: it pays the workers' start-up, as a cold
            `kz eval-suite` does (bench/kernelbench_compare.py measures that one); its second row
            counts from the service's start, as eval-suite's batch counts from kz's.
  round 2+  the same service, its workers started: a trainer's steady state, each step a batch
            of new candidates.
Each round's rates use the accounting of kernelbench_compare.py's report (each verdict's share of
the round's wall time; `cuda` carries its pre-builds). --kb-from takes KernelBench's rate from a
compare.json from the same host: those ratios are against KernelBench's cold batch,
and say so. Writes OUTDIR/service.json, OUTDIR/report.txt and the service's log.
"""
import argparse
import collections
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

BENCH = pathlib.Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
import compare_report  # noqa: E402
import make_eval_batch  # noqa: E402
from kernelbench_compare import trim  # noqa: E402

LISTENING = re.compile(r"serving evaluations on (http://\S+?/v1)")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, required=True, help="output directory")
    parser.add_argument("--kz", type=pathlib.Path, default=ROOT / "build" / "kz", help="the kz binary")
    parser.add_argument("--device", default="cuda:0", help="the service's --device (cpu, cuda:N, cuda:0,cuda:1)")
    parser.add_argument("--rounds", type=int, default=2, help="batches, one after the other (default 2)")
    parser.add_argument("--formats", default=",".join(compare_report.FORMATS), help="a subset of the batch's formats")
    parser.add_argument("--limit", type=int, default=0, help="the first N candidates of the batch only (tests)")
    parser.add_argument("--kb-from", type=pathlib.Path, help="a compare.json whose KernelBench rate the rates are set against")
    parser.add_argument("--round-timeout-s", type=float, default=600, help="per round (default 600)")
    parser.add_argument("--service-flag", action="append", default=[], help="one more flag for kz serve-eval")
    return parser.parse_args(argv)


class Service:
    """`kz serve-eval --port 0` in the background, its stderr in `log`; `url` once it listens."""

    def __init__(self, args, cache_home: pathlib.Path, log: pathlib.Path):
        command = [str(args.kz), "serve-eval", "--port", "0", "--device", args.device, "--no-cache", *args.service_flag]
        env = dict(os.environ, XDG_CACHE_HOME=str(cache_home))  # empty torch-extension and Triton caches
        self.command = " ".join(command)
        self.started = time.monotonic()
        self.log = log
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=open(log, "w"), env=env,
                                        start_new_session=True)
        self.url = self._wait_listening(timeout_s=120)

    def _wait_listening(self, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            match = LISTENING.search(self.log.read_text())
            if match:
                return match.group(1)
            if self.process.poll() is not None:
                raise SystemExit(f"kz serve-eval exited {self.process.returncode}: {self.log.read_text()[-2000:]}")
            time.sleep(0.05)
        self.stop()
        raise SystemExit(f"kz serve-eval did not listen within {timeout_s:g} s: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def batch_items(directory: pathlib.Path, rows: list) -> list:
    """The service's items for a written batch: the client id is the manifest's id."""
    return [{"id": r["id"], "task_id": r["task"], "format": "auto",
             "reference": (ROOT / r["reference"]).read_text(), "candidate": (directory / r["path"]).read_text()}
            for r in rows]


def run_round(service: Service, items: list, timeout_s: float) -> dict:
    """Submits one batch and reads its stream to the end: the verdicts and the wall time from the
    submission to the last verdict."""
    body = json.dumps({"items": items}).encode()
    started = time.monotonic()
    request = urllib.request.Request(f"{service.url}/evaluations", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        batch = json.load(answer)["batch"]
    verdicts = []
    with urllib.request.urlopen(f"{service.url}/batches/{batch}/stream", timeout=timeout_s) as stream:
        for line in stream:
            if line.strip():
                verdicts.append(json.loads(line)["verdict"])
    return {"batch": batch, "submitted_s": started - service.started, "wall_s": time.monotonic() - started,
            "verdicts": [trim(v) for v in verdicts]}


def kb_rate(path) -> tuple:
    """(KernelBench's cands/min, what it was measured on) from a compare.json; (None, "") without."""
    if not path:
        return None, ""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:  # a compare run that did not finish: rates without ratios
        return None, f"no KernelBench rate: {path} unreadable ({error})"
    totals = compare_report.kb_totals(data)
    rate = compare_report.per_minute(totals["count"], totals["seconds"])
    return rate, f"KernelBench's cold batch in {path.name}: {totals['count']} cuda samples, {compare_report.fmt_num(rate)}/min"


def round_rows(name: str, run: dict, kb: float) -> list:
    """The round's table rows: all, then per format (kernelbench_compare's accounting)."""
    data = {"kz_batch": run}
    count = len(run["verdicts"])
    rows = [[name, "all", count, compare_report.fmt_num(run["wall_s"]),
             compare_report.fmt_num(compare_report.per_minute(count, run["wall_s"])), ""]]
    for fmt, t in compare_report.kz_format_times(data).items():
        rate = compare_report.per_minute(t["count"], t["seconds"])
        rows.append([name, fmt, t["count"], compare_report.fmt_num(t["seconds"]), compare_report.fmt_num(rate),
                     compare_report.fmt_ratio(rate, kb)])
    return rows


def agreement(run: dict, manifest: dict, on_cpu: bool) -> str:
    wrong = [f"{v['id']}: {v['status']} (expected {compare_report.expected_status(manifest[v['id']], on_cpu)})"
             for v in run["verdicts"] if v["status"] != compare_report.expected_status(manifest[v["id"]], on_cpu)]
    return f"{len(run['verdicts']) - len(wrong)}/{len(run['verdicts'])} as expected" + (
        "; " + "; ".join(wrong) if wrong else "")


def prebuild_note(run: dict) -> str:
    """How many `cuda` verdicts came from a pre-build (the service's build threads), and when they ran."""
    cuda = [v for v in run["verdicts"] if v["format"] == "cuda"]
    built = [v for v in cuda if v.get("prebuild_s") is not None]
    if not built:
        return f"{len(cuda)} cuda, none pre-built" if cuda else "no cuda candidates"
    ends = [v["prebuild_started_s"] + v["prebuild_s"] for v in built if v.get("prebuild_started_s") is not None]
    return (f"{len(built)} of {len(cuda)} cuda pre-built (the others' builds failed there, or no build ran)"
            + (f", the last build done {max(ends):.1f} s after the submission" if ends else ""))


def device_note(run: dict) -> str:
    """Where the evaluations ran, where the service had several GPUs ("" with one): the pools' shares."""
    counts = collections.Counter(v.get("device") for v in run["verdicts"] if v.get("device"))
    if len(counts) < 2:
        return ""
    return "; evaluations per device: " + ", ".join(f"{device} {n}" for device, n in sorted(counts.items()))


def render(result: dict) -> str:
    kb, kb_where = result["kb_rate"], result["kb_where"]
    rows = []
    for i, run in enumerate(result["rounds"], 1):
        rows += round_rows(f"round {i}" + (" (cold)" if i == 1 else " (warm)"), run, kb)
        if i == 1:  # as a cold `kz eval-suite` is counted: from the process's start
            rows += round_rows("round 1, from the start", dict(run, wall_s=run["submitted_s"] + run["wall_s"]), kb)
    lines = [f"kz serve-eval on {result['device']}: {len(result['rounds'])} rounds of {result['candidates']} candidates, "
             f"each in new bytes (nothing cached or compiled before it)",
             f"service: {result['command']}", f"listening {result['listening_s']:.1f} s after its start",
             compare_report.table(["round", "format", "candidates", "wall s", "cands/min", "vs KernelBench cuda"], rows)]
    lines.append(f"  rates against {kb_where}" if kb else f"  {kb_where or 'no KernelBench rate given (--kb-from compare.json)'}")
    for i, run in enumerate(result["rounds"], 1):
        lines.append(f"round {i}: submitted {run['submitted_s']:.1f} s after the service's start; verdicts "
                     f"{run['agreement']}; {prebuild_note(run)}{device_note(run)}")
    for i, run in enumerate(result["rounds"], 1):  # where the time went, as kernelbench_compare.py says it
        lines += ["", f"round {i}, where the time went (from the submission) -- "
                  + compare_report.stage_section({"kz_batch": run})]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    args.out.mkdir(parents=True, exist_ok=True)
    cache_home = args.out / "cache"
    shutil.rmtree(cache_home, ignore_errors=True)
    batches = []
    for i in range(1, args.rounds + 1):
        directory = args.out / f"round-{i}"
        shutil.rmtree(directory, ignore_errors=True)
        rows = make_eval_batch.write_batch(directory, formats, salt="" if i == 1 else f"round {i}")
        batches.append((directory, rows[:args.limit] if args.limit else rows))
    manifest = {r["id"]: r for _, rows in batches for r in rows}
    kb, kb_where = kb_rate(args.kb_from)
    service = Service(args, cache_home, args.out / "service.err")
    result = {"device": args.device, "command": service.command.replace(str(ROOT) + "/", ""),
              "listening_s": time.monotonic() - service.started, "candidates": len(batches[0][1]),
              "kb_rate": kb, "kb_where": kb_where, "rounds": []}
    try:
        for directory, rows in batches:
            run = run_round(service, batch_items(directory, rows), args.round_timeout_s)
            run["agreement"] = agreement(run, manifest, args.device == "cpu")
            result["rounds"].append(run)
    finally:
        service.stop()
    (args.out / "service.json").write_text(json.dumps(result, indent=1) + "\n")
    report = render(result)
    (args.out / "report.txt").write_text(report + "\n")
    print(report)
    complete = all(len(run["verdicts"]) == len(rows) for run, (_, rows) in zip(result["rounds"], batches))
    return 0 if complete else 1


if __name__ == "__main__":
    sys.exit(main())
