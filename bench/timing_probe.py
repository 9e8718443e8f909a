"""Where does a candidate's timed median come from? (issue #3: the cuda-rtc speedup drop)

For every candidate in a directory (matched to the suite's reference by file name), in one process:
times the reference and the candidate with the harness's Timer, whose every sample gives two ends:
"sync", the end event recorded after the device-wide synchronize (the protocol before the end
moved to the stream: the host's wake-up inside every sample), and "event", the end event on the
current stream as the forward returns (device time from the start to the last work on the stream);
and measures the host time of one forward without any synchronize. A last column times both with
the harness's own protocol (timing.time_interleaved: ABBA over the input sets; `abba_end` says
which end it chose). `--hooks` installs the harness's launch-counting hooks first, `--audit` also
the sandbox's audit hook, so that three runs of this script (none, hooks, hooks+audit) show what
each costs. `--spin-us US` adds the harness's launch spin ([timing] launch_spin_us: a GPU spin
before the start event hides host launch latency) to the "spin" and "spin_event" columns (the same
two ends) and to the interleaved one;
`bench/timing_spread.py` compares several runs of this script (separate processes) to show each
protocol's spread.

    python3 bench/timing_probe.py --candidates suite/examples/cuda-rtc --format cuda-rtc \
        [--hooks] [--audit] --out probe.json          # GPU host, from the repository root

Prints a table; --out writes every figure as JSON.
"""
import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "worker"))
from kz_worker import cheats, loading, sandbox, timing  # noqa: E402


def host_us(model, inputs, calls: int = 50) -> float:
    """Median host microseconds of one forward call (launch overhead), the GPU drained between."""
    samples = []
    for _ in range(calls):
        torch.cuda.synchronize()
        start = time.perf_counter()
        model(*inputs)
        samples.append((time.perf_counter() - start) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(samples)


def medians_ms(timer, model, input_sets, runs: int) -> tuple:
    """The median of each end over `runs` samples: (synced, stream)."""
    samples = [timer.time_once(model, input_sets[i % len(input_sets)]) for i in range(runs)]
    return (statistics.median(s.synced_ms for s in samples), statistics.median(s.stream_ms for s in samples))


def timer_kinds(spin_us) -> list:
    return ["sync", "event"] + (["spin", "spin_event"] if spin_us > 0 else [])


def timers(device, flush_mb, spin_us) -> dict:
    """Timers by the kinds of their (synced, stream) ends."""
    made = {("sync", "event"): timing.Timer(device, flush_mb)}
    if spin_us > 0:
        made[("spin", "spin_event")] = timing.Timer(device, flush_mb, spin_us)  # [timing] launch_spin_us
    return made


def probe(reference_path, candidate_path, index, device, runs, flush_mb, spin_us):
    reference = loading.Reference(loading.import_path(reference_path, f"probe_ref{index}"), {})
    candidate = loading.import_path(candidate_path, f"probe_cand{index}")
    init = reference.init_inputs()
    ref_model = reference.build(init, 0, device)
    torch.manual_seed(0)
    cand_model = candidate.ModelNew(*loading.clone_all(init)).to(device).eval()
    loading.share_weights(ref_model, cand_model)
    input_sets = [reference.inputs(50_000 + k, device) for k in range(4)]
    row = {"task": reference_path.stem}
    with torch.no_grad():
        for name, model in (("ref", ref_model), ("cand", cand_model)):
            for _ in range(3):
                for inputs in input_sets:
                    model(*inputs)
            torch.cuda.synchronize()
            for kinds, timer in timers(device, flush_mb, spin_us).items():
                for kind, median in zip(kinds, medians_ms(timer, model, input_sets, runs)):
                    row[f"{name}_{kind}_ms"] = median
            row[f"{name}_host_us"] = host_us(model, input_sets[0])
    for kind in timer_kinds(spin_us):
        row[f"speedup_{kind}"] = row[f"ref_{kind}_ms"] / row[f"cand_{kind}_ms"]
    # The harness's own protocol: both models interleaved (ABBA) over the rotating input sets.
    settings = {"warmup_runs": 3, "runs": runs, "l2_flush_mb": flush_mb, "launch_spin_us": spin_us}
    measured = timing.time_interleaved(ref_model, cand_model, input_sets, settings, device)
    row["speedup_abba"] = measured["speedup"]
    row["abba_end"] = measured["end"]
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--candidates", required=True)
    parser.add_argument("--suite", default="suite/kzbench")
    parser.add_argument("--format", default="cuda-rtc")
    parser.add_argument("--hooks", action="store_true", help="install the harness's launch-counting hooks")
    parser.add_argument("--audit", action="store_true", help="also install the sandbox's audit hook")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--flush-mb", type=int, default=256, help="L2 flush buffer ([timing] l2_flush_mb)")
    parser.add_argument("--spin-us", type=float, default=0,
                        help="also time with a GPU spin of this long before each start event ([timing] launch_spin_us)")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--out")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.cuda.set_device(device)
    references = {p.name: p for p in pathlib.Path(args.suite).glob("level*/*.py")}
    if args.hooks or args.audit:
        cheats.install_launch_hooks(args.format)
    if args.audit:
        scratch = tempfile.mkdtemp(prefix="kz_probe_")
        writable = [scratch, "/tmp"] + ([os.path.dirname(os.path.abspath(args.out))] if args.out else [])
        sandbox.install({"sandbox": {"enabled": True, "writable_dirs": writable},
                         "scratch_dir": scratch, "device": args.device})
    rows = []
    for index, path in enumerate(sorted(pathlib.Path(args.candidates).glob("*.py"))):
        if path.name not in references:
            continue
        try:
            rows.append(probe(references[path.name], path, index, device, args.runs, args.flush_mb, args.spin_us))
        except Exception as exc:  # one broken candidate must not hide the others' figures
            rows.append({"task": path.stem, "error": f"{type(exc).__name__}: {exc}"})
    mode = "hooks+audit" if args.audit else "hooks" if args.hooks else "plain"
    print(f"mode {mode}, {args.runs} runs each, {args.flush_mb} MB L2 flush; ms medians; host_us: one forward without sync")
    kinds = timer_kinds(args.spin_us)
    print(f"{'task':24} " + " ".join(f"{'ref ' + k:>14} {'cand ' + k:>15}" for k in kinds)
          + f" {'ref host':>8} {'cand host':>9} " + " ".join(f"{'x ' + k:>12}" for k in kinds + ["abba"])
          + f" {'abba end':>11}")
    for r in rows:
        if "error" in r:
            print(f"{r['task']:24} {r['error']}")
            continue
        print(f"{r['task']:24} " + " ".join(f"{r[f'ref_{k}_ms']:14.4f} {r[f'cand_{k}_ms']:15.4f}" for k in kinds)
              + f" {r['ref_host_us']:8.1f} {r['cand_host_us']:9.1f} "
              + " ".join(f"{r[f'speedup_{k}']:12.3f}" for k in kinds + ["abba"]) + f" {r['abba_end']:>11}")
    ok = [r for r in rows if "error" not in r]
    for kind in kinds + ["abba"]:
        if ok:
            geo = statistics.geometric_mean([r[f"speedup_{kind}"] for r in ok])
            print(f"geomean speedup ({kind}): {geo:.3f}x over {len(ok)}")
    if args.out:
        pathlib.Path(args.out).write_text(
            json.dumps({"mode": mode, "runs": args.runs, "flush_mb": args.flush_mb, "spin_us": args.spin_us,
                        "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
