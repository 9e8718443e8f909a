"""The GPU timing protocol: reference and candidate timed interleaved in one process.

Each timed run: flush the L2 (write a buffer larger than it), record the start event, run the
model on the next of several rotating input sets (so caching results by pointer gains nothing),
synchronise the whole device (work on side streams is counted too), record the end event.
Reported: median and spread of each; speedup = reference median / candidate median.

The harness gets every candidate output after its run, outside the timed region
(`after_candidate`, to verify a sample of them: cheats.py), and is told when a new round over the
input sets begins (`new_round`, to move the input data between buffers, so that a result cached by
pointer turns stale).
"""
import statistics

import torch


class Timer:
    def __init__(self, device: torch.device, l2_flush_mb: int):
        self.device = device
        self.flush_buffer = torch.empty(max(l2_flush_mb, 1) * (1 << 20) // 4, dtype=torch.float32, device=device)
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)

    def time_once(self, model, inputs, after=None) -> float:
        self.flush_buffer.zero_()
        self.start.record()
        output = model(*inputs)
        torch.cuda.synchronize(self.device)
        self.end.record()
        self.end.synchronize()
        elapsed = self.start.elapsed_time(self.end)
        if after is not None:
            after(output)
        del output
        return elapsed


def summarize(samples_ms):
    ordered = sorted(samples_ms)
    n = len(ordered)
    return {
        "median_ms": statistics.median(ordered),
        "mean_ms": statistics.fmean(ordered),
        "std_ms": statistics.pstdev(ordered) if n > 1 else 0.0,
        "min_ms": ordered[0],
        "max_ms": ordered[-1],
        "p10_ms": ordered[int(0.1 * (n - 1))],
        "p90_ms": ordered[int(0.9 * (n - 1))],
        "runs": n,
    }


def time_interleaved(reference, candidate, input_sets, settings: dict, device: torch.device,
                     after_candidate=None, new_round=None, timer=None) -> dict:
    """Times both models alternately (ABBA order) over rotating input sets.

    after_candidate(set_index, output, run): called after each candidate run (run None: warm-up).
    new_round(r): called before run r * len(input_sets), r >= 1."""
    timer = timer or Timer(device, settings["l2_flush_mb"])
    n = len(input_sets)

    def candidate_once(k, run):
        after = None if after_candidate is None else (lambda output: after_candidate(k, output, run))
        return timer.time_once(candidate, input_sets[k], after)

    with torch.no_grad():
        for _ in range(settings["warmup_runs"]):
            for k, inputs in enumerate(input_sets):
                timer.time_once(reference, inputs)
                candidate_once(k, None)
        ref_ms, cand_ms = [], []
        for i in range(settings["runs"]):
            k = i % n
            if new_round is not None and k == 0 and i > 0:
                new_round(i // n)
            inputs = input_sets[k]
            if i % 2 == 0:
                ref_ms.append(timer.time_once(reference, inputs))
                cand_ms.append(candidate_once(k, i))
            else:
                cand_ms.append(candidate_once(k, i))
                ref_ms.append(timer.time_once(reference, inputs))
    ref, cand = summarize(ref_ms), summarize(cand_ms)
    return {"reference": ref, "candidate": cand, "speedup": ref["median_ms"] / cand["median_ms"]}
