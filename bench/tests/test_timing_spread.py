"""bench/timing_spread.py on synthetic probe outputs: spreads are max/min across processes."""
import math
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import timing_spread  # noqa: E402


def probe_run(cand_ms, ref_ms, abba):
    return {"rows": [{"task": "broken", "error": "RuntimeError: no GPU"},  # first: kinds come from every row
                     {"task": "07_softmax", "cand_sync_ms": cand_ms, "ref_sync_ms": ref_ms,
                      "speedup_sync": ref_ms / cand_ms, "speedup_abba": abba}]}


def test_spread_is_max_over_min_across_processes():
    runs = [probe_run(0.10, 0.12, 1.0), probe_run(0.15, 0.13, 1.2), probe_run(0.12, 0.12, 1.1)]
    rows = {(task, kind): rest for task, kind, *rest in timing_spread.summarize(runs)}
    cand, ref, speedup, median = rows[("07_softmax", "sync")]
    assert math.isclose(cand, 1.5) and math.isclose(ref, 0.13 / 0.12)
    assert math.isclose(speedup, 1.2 / (0.13 / 0.15))
    assert math.isclose(median, 1.0)
    cand, ref, speedup, median = rows[("07_softmax", "abba")]
    assert math.isnan(cand) and math.isclose(speedup, 1.2)  # the interleaved protocol reports only a speedup
    assert not any(task == "broken" for task, _ in rows)


def test_runs_with_and_without_a_protocol_mix():
    spin = probe_run(0.10, 0.12, 1.0)
    spin["rows"][1].update(cand_spin_ms=0.09, ref_spin_ms=0.12, speedup_spin=0.12 / 0.09)
    rows = {(task, kind): rest for task, kind, *rest in timing_spread.summarize([probe_run(0.1, 0.12, 1.0), spin])}
    assert ("07_softmax", "spin") in rows and math.isclose(rows[("07_softmax", "spin")][2], 1.0)  # one run of it
