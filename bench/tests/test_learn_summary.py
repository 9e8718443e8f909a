"""bench/learn_summary.py on synthetic kz evolve runs: the table, the fused share, the Proposer's
p-hat band, the per-iteration dynamics, learn.json and learn.html."""
import json
import pathlib
import subprocess
import sys

BENCH = pathlib.Path(__file__).resolve().parents[1]

FUSED = "__global__ void fused(float* y) {}\n"
UNFUSED = "__global__ void a(float* y) {}\n__global__ void b(float* y) {}\n"


def write_jsonl(path: pathlib.Path, rows: list) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def make_run(root: pathlib.Path, name: str, suite: pathlib.Path, metrics: list, provenance: list,
             kernels: dict) -> None:
    run = root / name
    run.mkdir(parents=True)
    (run / "config.toml").write_text(f'[heldout]\nsuite = "{suite}"\n\n[frontier]\nband_low = 0.125\n'
                                     'band_high = 0.875\n')
    write_jsonl(run / "metrics.jsonl", metrics)
    write_jsonl(run / "provenance.jsonl", provenance)
    for rel, source in kernels.items():
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_text(source)


def heldout(i, evals, pass_at_1, fast_1, geomean):
    return {"phase": "heldout", "iteration": i, "training_evaluations": evals, "pass_at_1": pass_at_1,
            "fast_1": fast_1, "geomean_speedup": geomean}


def kernel(i, task, correct, file):
    return {"kind": "kernel", "phase": "heldout", "iteration": i, "task_id": task, "correct": correct, "file": file}


def summarize(tmp_path: pathlib.Path):
    result = subprocess.run([sys.executable, str(BENCH / "learn_summary.py"), str(tmp_path / "runs"),
                             "--out", str(tmp_path / "out")], capture_output=True, text=True)
    return result


def test_table_dynamics_and_report(tmp_path):
    suite = tmp_path / "suite"
    (suite / "level2").mkdir(parents=True)
    (suite / "level2" / "h2.py").write_text("# two ops\n")
    (suite / "level2" / "h3.py").write_text("# two ops\n")
    runs = tmp_path / "runs"
    make_run(runs, "ca_grpo-1", suite,
             metrics=[heldout(0, 0, 0.5, 0.25, 0.8),
                      {"phase": "proposer", "iteration": 1, "training_evaluations": 12, "valid_rate": 0.75,
                       "frontier_size": 2, "judged": 3, "joined_frontier": 2, "pass_rate_mean": 0.5},
                      {"phase": "coder", "iteration": 1, "training_evaluations": 76, "correct_rate": 0.625,
                       "entropy": 0.01, "kl": 0.0002, "clip_fraction": 0.001, "zero_variance_groups": 1,
                       "gate_on_share": 0.5, "optimizer_steps": 8},
                      heldout(1, 76, 0.75, 0.5, 1.25)],
             provenance=[{"kind": "module", "iteration": 1, "pass_rate": 0.5},
                         {"kind": "module", "iteration": 1, "pass_rate": 1.0},
                         {"kind": "module", "iteration": 1, "pass_rate": 0.0},
                         {"kind": "module", "iteration": 1, "pass_rate": 0.25},
                         kernel(0, "h2", True, "k/0-h2.cu"), kernel(0, "h3", False, "k/0-h3.cu"),
                         kernel(1, "h2", True, "k/1-h2.cu"), kernel(1, "h3", True, "k/1-h3.cu"),
                         kernel(1, "h1", True, "k/1-h1.cu")],  # h1: one op, left out of the fused share
             kernels={"k/0-h2.cu": UNFUSED, "k/0-h3.cu": FUSED, "k/1-h2.cu": FUSED, "k/1-h3.cu": UNFUSED,
                      "k/1-h1.cu": FUSED})
    make_run(runs, "static-1", suite, metrics=[heldout(0, 0, 0.5, 0.25, 0.8)], provenance=[], kernels={})
    make_run(runs, "ungated-2", suite, metrics=[], provenance=[], kernels={})
    (runs / "not-a-run").mkdir()

    result = summarize(tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    row = next(line.split() for line in lines if line.startswith("ca_grpo-1 "))
    # iters, training evals, pass@1 start and end, fast_1 end, geomean end, fused end, p-hat in band
    assert row[1:] == ["1", "76", "0.500", "0.750", "0.500", "1.25x", "0.50", "0.50"]
    assert next(line for line in lines if line.startswith("static-1 ")).split()[-1] == "-"  # no Proposer
    assert any(line.startswith("ungated-2") and "no held-out point" in line for line in lines)
    ablation = next(line.split() for line in lines if line.startswith("ca_grpo ") and len(line.split()) == 6)
    assert ablation == ["ca_grpo", "1", "0.500", "0.750", "0.500", "1.25x"]

    assert ("ca_grpo-1            it   1 proposer valid 0.75 frontier 2 p-hat 0.50 evals 12") in lines
    assert ("ca_grpo-1            it   1 coder    correct 0.625 entropy 0.0100 kl 0.00020 clip 0.0010 "
            "zero-var 1 gate-on 0.50 evals 76") in lines
    order = [line.split()[3] for line in lines if line.startswith("ca_grpo-1            it")]
    assert order == ["heldout", "proposer", "coder", "heldout"]

    data = json.loads((tmp_path / "out" / "learn.json").read_text())
    assert set(data) == {"ca_grpo-1", "static-1", "ungated-2"}
    assert [p["fused_share"] for p in data["ca_grpo-1"]["heldout"]] == [0.0, 0.5]
    band = data["ca_grpo-1"]["proposer"][0]
    assert (band["judged"], band["in_band"], band["at_0"], band["at_1"]) == (4, 0.5, 0.25, 0.25)
    page = (tmp_path / "out" / "learn.html").read_text()
    assert page.count("<svg") == 6 and "Coder phase: correct rate" in page


def test_no_runs_is_an_error(tmp_path):
    (tmp_path / "runs").mkdir()
    result = summarize(tmp_path)
    assert result.returncode == 1
    assert "no runs under" in result.stderr
