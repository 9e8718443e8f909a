"""bench/goal_summary.py on compare.json files made here with known rates: each run's ratios per
complete batch, the pooling per code version (recorded or given), and a file that is not a compare."""
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import goal_summary  # noqa: E402
import kernelbench_compare  # noqa: E402


def batch(round_no: int, cuda_s: float, rtc_each_s: float, complete=True) -> dict:
    """One cold kz batch whose verdicts' seconds add up to its wall time (each format charged exactly
    its own): the cuda candidate KernelBench also ran, and two cuda-rtc ones."""
    verdicts = [{"id": "t0/cuda", "format": "cuda", "wall_s": cuda_s},
                {"id": "t1/rtc", "format": "cuda-rtc", "wall_s": rtc_each_s},
                {"id": "t2/rtc", "format": "cuda-rtc", "wall_s": rtc_each_s}]
    return {"round": round_no, "complete": complete, "wall_s": cuda_s + 2 * rtc_each_s, "verdicts": verdicts}


def write_run(path: pathlib.Path, rounds: list, host=None, commit=None) -> str:
    # KernelBench: a 50 s pre-build and one 10 s sample: 1 per minute.
    data = {"settings": {"device": "cuda:0", "host": host, "kz_commit": commit},
            "kb": {"prebuild": {"wall_s": 50.0}, "eval": {"outcomes": [{"id": "t0/cuda", "wall_s": 10.0}]}},
            "kz_rounds": rounds, "kz_batch": rounds[0]}
    path.write_text(json.dumps(data))
    return str(path)


def test_each_runs_batches_and_the_pooled_medians_per_code(tmp_path, capsys):
    # cuda 6 s -> 10/min (10x); cuda-rtc 2 in 2 s -> 60/min (60x). cuda 12 s -> 5x; 2 in 3 s -> 40x.
    one = write_run(tmp_path / "one.json", [batch(1, 6.0, 1.0), batch(2, 12.0, 1.5), batch(3, 6.0, 1.0, complete=False)],
                    host="GPU-aaaa", commit="abc123")
    two = write_run(tmp_path / "two.json", [batch(1, 4.0, 0.8)], host="GPU-bbbb", commit="abc123")  # 15x, 75x
    old = write_run(tmp_path / "old.json", [batch(1, 6.0, 1.5)])  # 10x, 40x; nothing recorded
    assert goal_summary.main([one, two, f"{old}=before"]) == 0
    text = capsys.readouterr().out
    row = next(line for line in text.splitlines() if line.split() and line.split()[0] == one)
    assert row.split()[1:4] == ["abc123", "GPU-aaaa", "1.00"], row
    assert "10.00, 5.00" in row and "60.00, 40.00" in row, "the incomplete batch is not rated: " + row
    # The pooled rows' words: code, runs, hosts, format, ">=", goal, batches, median, range, met.
    pooled = {tuple(line.split()[:4]): line.split() for line in text.splitlines() if line.startswith(("abc123", "before"))}
    # abc123: cuda 10, 5, 15 -> median 10.00, all met; cuda-rtc 60, 40, 75 -> median 60.00, 2 of 3 met.
    assert pooled[("abc123", "2", "2", "cuda")][6:] == ["3", "10.00", "5.00-15.00", "2", "of", "3"]
    assert pooled[("abc123", "2", "2", "cuda-rtc")][6:] == ["3", "60.00", "40.00-75.00", "2", "of", "3"]
    assert pooled[("before", "1", "1", "cuda-rtc")][6:] == ["1", "40.00", "40.00-40.00", "0", "of", "1"]


def test_runs_without_a_recorded_host_count_one_host_each(tmp_path):
    # Named as gpu_suite.sh names them: compare/compare.json, each run in a folder of its own.
    paths = []
    for name in ("a", "b", "c", "d"):
        (tmp_path / name).mkdir()
        paths.append(tmp_path / name / "compare.json")
    runs = [goal_summary.load(write_run(path, [batch(1, 6.0, 1.0)])) for path in paths[:2]]
    runs += [goal_summary.load(write_run(path, [batch(1, 6.0, 1.0)], host="GPU-x")) for path in paths[2:]]
    assert len(goal_summary.pooled(runs)["unrecorded"]["hosts"]) == 3


def test_a_file_that_is_not_a_compare_is_named(tmp_path, capsys):
    good = write_run(tmp_path / "good.json", [batch(1, 6.0, 1.0)])
    (tmp_path / "bad.json").write_text('{"kz_batch": ')
    (tmp_path / "other.json").write_text('{"rounds": []}')
    assert goal_summary.main([good, str(tmp_path / "bad.json")]) == 2
    assert "bad.json: not a readable compare.json" in capsys.readouterr().err
    assert goal_summary.main([str(tmp_path / "other.json")]) == 2
    assert "other.json: no kz_batch" in capsys.readouterr().err


def test_the_pooled_figures_as_json(tmp_path, capsys):
    run = write_run(tmp_path / "one.json", [batch(1, 6.0, 1.0)], host="GPU-a", commit="c1")
    assert goal_summary.main([run, "--json", str(tmp_path / "pooled.json")]) == 0
    pooled = json.loads((tmp_path / "pooled.json").read_text())
    assert pooled["c1"]["hosts"] == ["GPU-a"]
    assert [round(x, 6) for x in pooled["c1"]["ratios"]["cuda-rtc"]] == [60.0]


def test_a_compare_records_the_commit_it_ran(tmp_path, monkeypatch):
    # $KZ_COMMIT where set, even in a tree with history (the device's copy may carry a stale .git);
    # else this tree's history where it has one (a clone does).
    monkeypatch.delenv("KZ_COMMIT", raising=False)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:
        assert kernelbench_compare.kz_commit().startswith(head.stdout.strip())
    monkeypatch.setenv("KZ_COMMIT", "feedbeef")  # in this tree, with its history where it has one
    assert kernelbench_compare.kz_commit() == "feedbeef"
    monkeypatch.delenv("KZ_COMMIT")
    monkeypatch.setattr(kernelbench_compare, "ROOT", tmp_path)  # no history here
    assert kernelbench_compare.kz_commit() is None
