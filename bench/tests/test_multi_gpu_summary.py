"""bench/multi_gpu_summary.py on synthetic runs: rates, verdicts against the manifest, per-GPU counts."""
import json
import pathlib
import subprocess
import sys

BENCH = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))
import multi_gpu_summary  # noqa: E402

MANIFEST = [{"id": "02_relu/cuda-rtc__correct", "expected": "ok"},
            {"id": "03_gelu/triton__wrong_result", "expected": "incorrect"}]


def verdict(cid, status, device, speedup=None, exclusive=0.5):
    task, stem = cid.split("/")
    return {"candidate": f"batch/candidates/{task}/{stem}.py", "status": status, "device": device,
            "speedup": speedup, "profile": {"gpu_exclusive_s": exclusive}}


def test_rates_devices_and_speedups():
    one = [verdict(MANIFEST[0]["id"], "ok", "cuda:0", 1.5), verdict(MANIFEST[1]["id"], "incorrect", "cuda:0")]
    two = [verdict(MANIFEST[0]["id"], "ok", "cuda:1", 1.48), verdict(MANIFEST[1]["id"], "incorrect", "cuda:0")]
    walls = [("cuda:0", 0, 60.0), ("cuda:0,cuda:1", 0, 30.0)]
    text, mismatches = multi_gpu_summary.summarize(MANIFEST, walls, [one, two])
    assert mismatches == 0
    assert "2.00x the rate" in text
    assert "cuda:0: 1 evals, 0.5 s exclusive, cuda:1: 1 evals, 0.5 s exclusive" in text
    assert "1.500" in text and "1.480" in text


def test_a_wrong_or_missing_verdict_fails_the_run(tmp_path):
    (tmp_path / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in MANIFEST))
    (tmp_path / "walls.txt").write_text("cuda:0: exit 0, 12 s wall\n")
    (tmp_path / "run.jsonl").write_text(json.dumps(verdict(MANIFEST[0]["id"], "incorrect", "cuda:0")) + "\n")
    result = subprocess.run([sys.executable, str(BENCH / "multi_gpu_summary.py"), "--manifest",
                             str(tmp_path / "manifest.jsonl"), "--walls", str(tmp_path / "walls.txt"),
                             str(tmp_path / "run.jsonl")], capture_output=True, text=True)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "2 verdict(s) differ" in result.stdout  # one wrong, one missing


def test_the_same_devices_twice_are_told_apart():
    first = [verdict(MANIFEST[0]["id"], "ok", "cuda:0", 1.5)]
    second = [verdict(MANIFEST[0]["id"], "ok", "cuda:0", 1.2)]
    text, _ = multi_gpu_summary.summarize(MANIFEST, [("cuda:0", 0, 60.0), ("cuda:0", 0, 60.0)], [first, second])
    assert "cuda:0 #1" in text and "cuda:0 #2" in text
    assert "1.500" in text and "1.200" in text  # both runs' speedups, not one overwriting the other
