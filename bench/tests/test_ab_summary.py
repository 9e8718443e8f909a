"""bench/ab_summary.py on A/B runs made here with known numbers: the per-run figures (the batch, the
pre-builds' end, the charged rates, the summed start-up), the medians and the pair-by-pair changes,
and what it leaves out."""
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import ab_summary  # noqa: E402


def verdict(fmt, wall_s, startup_s, prebuild=None):
    v = {"format": fmt, "wall_s": wall_s, "stage_s": {"startup": startup_s}}
    if prebuild:
        v["prebuild_started_s"], v["prebuild_s"] = prebuild
    return v


def write_run(out: pathlib.Path, name: str, batch_s: float, rtc_startup: float, complete=True):
    """One cuda and two cuda-rtc verdicts whose summed seconds equal the batch's wall time (so each
    format is charged exactly its own): cuda 6 s (its pre-build 0.5-4.5 s), cuda-rtc the rest."""
    rtc_each = (batch_s - 6.0) / 2
    data = {"kz_batch": {"wall_s": batch_s, "complete": complete, "verdicts": [
        verdict("cuda", 2.0, 0.5, prebuild=(0.5, 4.0)),
        verdict("cuda-rtc", rtc_each, rtc_startup / 2),
        verdict("cuda-rtc", rtc_each, rtc_startup / 2)]}}
    (out / name).mkdir()
    (out / name / "compare.json").write_text(json.dumps(data))


def test_runs_medians_and_pairs(tmp_path):
    write_run(tmp_path, "A-1", 10.0, 3.0)   # cuda-rtc: 2 in 4 s = 30/min
    write_run(tmp_path, "B-1", 8.0, 2.0)    # 2 in 2 s = 60/min
    write_run(tmp_path, "A-2", 12.0, 5.0)   # 2 in 6 s = 20/min
    write_run(tmp_path, "B-2", 11.0, 4.0)   # 2 in 5 s = 24/min
    write_run(tmp_path, "B-3", 9.0, 1.0, complete=False)
    (tmp_path / "notes").mkdir()
    runs, skipped = ab_summary.load_runs(tmp_path)
    assert sorted(runs) == [("A", 1), ("A", 2), ("B", 1), ("B", 2)]
    assert skipped == ["B-3: its kz batch did not complete"]  # and A-3 was never there: no pair to name
    a1 = runs[("A", 1)]
    assert a1["batch_s"] == 10.0 and a1["prebuilds_end_s"] == 4.5
    assert a1["rates"]["cuda-rtc"] == 30.0 and a1["rates"]["cuda"] == 10.0  # 1 in 6 s
    assert a1["startup_s"] == {"cuda": 0.5, "cuda-rtc": 3.0}

    text = ab_summary.render(runs, skipped, "bench/configs/x.toml")
    lines = text.splitlines()
    assert lines[0] == "A/B: A = the defaults, B = bench/configs/x.toml; 2 pair(s)"
    row = {line.split()[0] + (" " + line.split()[1] if line.startswith(("A median", "B median", "round")) else ""):
           line.split() for line in lines[3:]}
    # batch, pre-builds end, cuda /min, cuda-rtc /min, cuda start-up, cuda-rtc start-up
    assert row["A median"][3:] == ["11.0", "4.5", "10.0", "25.0", "0.5", "4.0"]
    assert row["B median"][3:] == ["9.5", "4.5", "10.0", "42.0", "0.5", "3.0"]
    assert row["round 1"][2:] == ["-20%", "+0%", "+0%", "+100%", "+0%", "-33%"]
    assert row["round 2"][2:] == ["-8%", "+0%", "+0%", "+20%", "+0%", "-20%"]
    assert "  left out: B-3: its kz batch did not complete" in lines


def test_a_run_without_its_partner_is_named(tmp_path):
    write_run(tmp_path, "A-1", 10.0, 3.0)
    write_run(tmp_path, "B-1", 8.0, 2.0)
    write_run(tmp_path, "A-2", 12.0, 5.0)
    runs, skipped = ab_summary.load_runs(tmp_path)
    assert skipped == ["B-2: not there or not usable, so A-2 is in its side's median but in no pair"]
    text = ab_summary.render(runs, skipped)
    assert "; 1 pair(s)" in text.splitlines()[0]
    assert "round 2" not in text


def test_no_usable_run_says_so(tmp_path, capsys):
    (tmp_path / "A-1").mkdir()
    (tmp_path / "A-1" / "compare.json").write_text("{truncated")
    assert ab_summary.main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("no complete A/B run found")
    assert "A-1: no usable compare.json" in out
    assert ab_summary.main([str(tmp_path / "missing")]) == 2
