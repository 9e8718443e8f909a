"""bench/service_batch.py's report: the rounds' rates and the ratio to a compare run's KernelBench rate.
The run itself (a real kz serve-eval on the CPU) is in batch_cpu_test.sh."""
import json
import re
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import service_batch  # noqa: E402


def verdict(vid, fmt, wall_s, prebuild_s=None):
    return {"id": vid, "format": fmt, "status": "ok", "wall_s": wall_s, "prebuild_s": prebuild_s}


def test_rates_are_set_against_the_compare_runs_kernelbench(tmp_path):
    compare = {"kb": {"prebuild": {"wall_s": 60.0},
                      "eval": {"outcomes": [{"id": f"t{i}/cuda__correct", "wall_s": 6.0} for i in range(10)]}}}
    (tmp_path / "compare.json").write_text(json.dumps(compare))
    rate, where = service_batch.kb_rate(tmp_path / "compare.json")
    assert rate == 5.0  # 10 samples in 60 + 60 s
    assert "compare.json: 10 cuda samples" in where
    # One round: 2 cuda (one pre-built) and 1 triton, all at once in 6 s of wall time.
    run = {"wall_s": 6.0, "submitted_s": 0.2, "agreement": "3/3 as expected",
           "verdicts": [verdict("a/cuda__correct", "cuda", 2.0, prebuild_s=8.0), verdict("b/cuda__correct", "cuda", 1.0),
                        verdict("c/triton__correct", "triton", 1.0)]}
    rows = service_batch.round_rows("round 2 (warm)", run, rate)
    by_format = {row[1]: row for row in rows}
    assert by_format["all"][4] == "30.0"  # 3 in 6 s
    # cuda's share: (10 + 1) of the 12 charged seconds, scaled to 6 s of wall time: 5.5 s for 2.
    assert by_format["cuda"][3] == "5.5" and by_format["cuda"][4] == "21.8" and by_format["cuda"][5] == "4.36x"
    assert by_format["triton"][3] == "0.5" and by_format["triton"][4] == "120.0"
    text = service_batch.render({"device": "cuda:0", "command": "kz serve-eval", "listening_s": 0.1, "candidates": 3,
                                 "kb_rate": rate, "kb_where": where, "rounds": [run, run]})
    assert "round 1 (cold)" in text and "round 2 (warm)" in text and "rates against KernelBench" in text
    assert "round 2, where the time went (from the submission) -- kz: seconds per stage" in text
    from_start = next(line for line in text.splitlines() if line.startswith("round 1, from the start") and " all " in line)
    assert "6.2" in from_start.split(), from_start  # 0.2 s to the submission, then 6 s
    run["verdicts"][0].update(prebuild_started_s=0.5)
    assert "1 of 2 cuda pre-built" in service_batch.prebuild_note(run)
    assert "last build done 8.5 s after" in service_batch.prebuild_note(run)


def test_without_a_compare_run_there_is_no_ratio(tmp_path):
    assert service_batch.kb_rate(None) == (None, "")
    rate, where = service_batch.kb_rate(tmp_path / "missing.json")
    assert rate is None and "unreadable" in where
    run = {"wall_s": 2.0, "submitted_s": 0.1, "agreement": "1/1 as expected",
           "verdicts": [verdict("c/triton__correct", "triton", 1.0)]}
    text = service_batch.render({"device": "cpu", "command": "kz serve-eval", "listening_s": 0.1, "candidates": 1,
                                 "kb_rate": None, "kb_where": "", "rounds": [run]})
    assert "no KernelBench rate given" in text and not re.search(r"\d\.\d\dx", text)


def test_several_devices_show_each_pools_share():
    on = lambda device: dict(verdict("t/triton__correct", "triton", 1.0), device=device)  # noqa: E731
    run = {"verdicts": [on("cuda:0"), on("cuda:1"), on("cuda:1"), dict(on(""), status="format_error")]}
    assert service_batch.device_note(run) == "; evaluations per device: cuda:0 1, cuda:1 2"
    assert service_batch.device_note({"verdicts": [on("cuda:0"), on("cuda:0")]}) == ""  # one device: nothing to say


def test_with_several_devices_the_waits_for_workers_are_told_per_device():
    import compare_report

    def on(device, startup):
        return dict(verdict("t/triton__correct", "triton", 1.0), device=device, stage_s={"startup": startup})

    verdicts = [on("cuda:0", 0.5), on("cuda:1", 4.0), on("cuda:1", 0.4), on("cuda:1", 5.0)]
    assert compare_report.waits_per_device(verdicts) == [
        "    per device: cuda:0 1 (0 waited, startup 0.5 s); cuda:1 3 (2 waited, startup 9.4 s)"]
    assert compare_report.waits_per_device(verdicts[:1]) == [], "one device: nothing to split"
    text = compare_report.stage_section({"kz_batch": {"wall_s": 6.0, "verdicts": verdicts}})
    assert "per device: cuda:0 1" in text
