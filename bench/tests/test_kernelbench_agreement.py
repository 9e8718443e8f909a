"""bench/kernelbench_agreement.py on the CPU: the GPU path end to end with stand-ins for both
harnesses (a `kz eval-suite` and a `kernelbench` package written here, answering from markers in
each sample's source), and the table's logic on known verdicts. The real harnesses run on the GPU host."""
import contextlib
import io
import json
import os
import pathlib
import signal
import stat
import sys
import threading
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import kernelbench_agreement as agreement  # noqa: E402

FAKE_KZ = '''
import argparse, json, pathlib
p = argparse.ArgumentParser()
p.add_argument("command")
for flag in ("--suite", "--candidates", "--device", "--config", "--policy", "--out"):
    p.add_argument(flag)
for flag in ("--no-timing", "--no-cache", "--quiet"):
    p.add_argument(flag, action="store_true")
a = p.parse_args()
assert a.command == "eval-suite" and a.no_timing and a.no_cache
assert 'rule = "kernelbench"' in pathlib.Path(a.config).read_text()
with open(a.out, "w") as out:
    for path in sorted(pathlib.Path(a.candidates).rglob("*.py")):
        text = path.read_text()
        status = "ok"
        if "FAKE_COMPILE_FAIL" in text: status = "compile_error"
        elif "FAKE_WRONG" in text or "FAKE_KZ_WRONG" in text: status = "incorrect"
        elif a.policy == "strict" and "FAKE_TORCH_OP" in text: status = "cheat_detected"
        checks = ["output_mismatch"] if status == "incorrect" else []
        held = pathlib.Path(a.out).parent / ("held-" + path.stem)  # the card short the first time
        if "FAKE_OOM" in text and not held.exists():
            held.write_text("")
            status, checks = "infra_error", ["gpu_memory_held_elsewhere"]
        out.write(json.dumps({"task_id": path.parent.name, "candidate": str(path), "status": status,
                              "checks": checks, "message": "max abs diff 1.5" if checks else "",
                              "policy": a.policy}) + "\\n")
'''

FAKE_KB_EVAL = '''
import os, pathlib


class KernelExecResult:
    def __init__(self, compiled=False, correctness=False, metadata=None):
        self.compiled, self.correctness, self.metadata = compiled, correctness, metadata or {}
        self.runtime = self.ref_runtime = -1.0
        self.runtime_stats = {}


def get_torch_dtype_from_string(name):
    import torch
    return {"fp32": torch.float32}[name]


def load_original_model_and_inputs(source, context):
    exec(source, context)
    return context.get("Model"), context.get("get_init_inputs"), context.get("get_inputs")


def build_compile_cache(custom_model_src, verbose=False, build_dir=None):
    os.makedirs(build_dir, exist_ok=True)
    if "FAKE_COMPILE_FAIL" in custom_model_src:
        return False, "", "error: identifier undefined"
    return True, "", None


def eval_kernel_against_ref(original_model_src, custom_model_src, build_dir=None, **settings):
    assert settings["num_correct_trials"] == 5 and settings["measure_performance"] is False
    assert str(settings["device"]).startswith("cuda:")
    if "FAKE_COMPILE_FAIL" in custom_model_src:
        return KernelExecResult(compiled=False, metadata={"compilation_error": "identifier undefined"})
    if "FAKE_OOM" in custom_model_src:
        marker = pathlib.Path(build_dir) / "oom-once"
        if not marker.exists():
            marker.write_text("")
            return KernelExecResult(compiled=True, metadata={"runtime_error": "CUDA out of memory"})
    if "FAKE_HANG" in custom_model_src:
        import time
        (pathlib.Path(build_dir) / "hanging").write_text("")
        time.sleep(600)
    if "FAKE_WRONG" in custom_model_src:
        return KernelExecResult(compiled=True, metadata={"correctness_issue": "Output mismatch",
                                                          "max_difference": ["2.0"]})
    return KernelExecResult(compiled=True, correctness=True, metadata={"correctness_trials": "(5 / 5)"})
'''

REFERENCE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(4)]


def get_init_inputs():
    return []
'''

# (marker, recorded class): what each stand-in answers; FAKE_KZ_WRONG is a disagreement.
SAMPLES = [("", "correct"), ("FAKE_WRONG", "incorrect"), ("FAKE_COMPILE_FAIL", "compile_error"),
           ("FAKE_KZ_WRONG", "correct"), ("FAKE_OOM", "correct"), ("FAKE_TORCH_OP", "correct"),
           ("FAKE_HANG", "correct")]
# KernelBench's per-sample timeout: a fresh spawned process importing torch takes well over 8 s on a
# loaded 2-core machine, so a run without the hanging sample allows plenty, and the one with it
# waits for it this long.
KB_TIMEOUT_S, HANG_TIMEOUT_S = "120", "30"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("world")
    kb = root / "KernelBench"
    for level in (1, 2):
        (kb / "KernelBench" / f"level{level}").mkdir(parents=True)
        (kb / "KernelBench" / f"level{level}" / "1_Relu.py").write_text(REFERENCE)
    package = kb / "src" / "kernelbench"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "eval.py").write_text(FAKE_KB_EVAL)
    (package / "utils.py").write_text("def set_gpu_arch(arches):\n    pass\n")
    samples = root / "samples"
    (samples / "kernels").mkdir(parents=True)
    lines = []
    for index, (marker, recorded) in enumerate(SAMPLES):
        level = 1 + index % 2
        kernel = f"kernels/s{index}.py"
        (samples / kernel).write_text(f"# {marker}\nimport torch\nclass ModelNew(torch.nn.Module):\n    pass\n")
        lines.append(json.dumps({"id": f"run-p1-s{index}", "level": level, "problem_id": 1, "problem": "1_Relu",
                                 "reference": f"KernelBench/level{level}/1_Relu.py", "kernel": kernel,
                                 "run": "run", "recorded": {"class": recorded},
                                 "source": {"repo": "someone/KernelBench", "commit": "0" * 40, "path": kernel}}))
    (samples / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    kz = root / "kz"
    (root / "fake_kz.py").write_text(FAKE_KZ)
    kz.write_text(f"#!/bin/sh\nexec '{sys.executable}' '{root / 'fake_kz.py'}' \"$@\"\n")
    kz.chmod(kz.stat().st_mode | stat.S_IEXEC)
    return root, kb, samples, kz


def run_main(argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = agreement.main([str(a) for a in argv])
    return code, out.getvalue()


@pytest.fixture(scope="module")
def gpu_run(world, tmp_path_factory):
    root, kb, samples, kz = world
    out = tmp_path_factory.mktemp("run")
    code, text = run_main(["--samples", samples, "--kernelbench", kb, "--kz", kz, "--out", out, "--device",
                           "cuda:0", "--kb-workers", "2", "--kb-eval-jobs", "3", "--kb-timeout", HANG_TIMEOUT_S,
                           "--budget-s", "300", "--chunk", "3"])
    return code, text, out, json.loads((out / "agreement.json").read_text())


def test_both_sides_judge_every_sample(gpu_run):
    code, text, out, data = gpu_run
    assert code == 0, text
    rows = {r["id"]: r for r in data["rows"]}
    assert len(rows) == len(SAMPLES)
    assert rows["run-p1-s0"]["kb"] == "ok" and rows["run-p1-s0"]["kz"] == "ok" and rows["run-p1-s0"]["agree"]
    assert rows["run-p1-s1"]["kb"] == "incorrect" and rows["run-p1-s1"]["agree"]
    assert rows["run-p1-s2"]["kb"] == "compile_error" and rows["run-p1-s2"]["kz"] == "compile_error"
    assert rows["run-p1-s4"]["kb"] == "ok"  # out of memory beside the others, then alone: correct
    assert rows["run-p1-s6"]["kb"] == "timeout" and rows["run-p1-s6"]["kb_correct"] is False
    # Out of memory while the next chunk built beside it: evaluated again once the chunks were done.
    assert data["kb"]["retried"] == ["run-p1-s4"] and data["notes"]["kb again alone"].startswith("1 of 1 in")
    assert data["notes"]["chunks"] == "3 of up to 3 samples"
    # kz's first answer was about the machine (memory held elsewhere): no verdict, judged again alone.
    assert rows["run-p1-s4"]["kz"] == "ok" and data["notes"]["kz again"].startswith("1 of 1 verdicts")
    assert '"gpu_memory_held_elsewhere"' in (out / "kz-kernelbench-c2.jsonl").read_text()  # s3-s5
    assert (out / "gpu-memory.log").exists()
    assert rows["run-p1-s5"]["kz_strict"] == "cheat_detected" and rows["run-p1-s5"]["kz"] == "ok"


def test_the_summary_counts_and_lists_the_disagreement(gpu_run):
    _, text, out, data = gpu_run
    s = data["summary"]
    assert (s["judged"], s["agree"], s["kb_only_correct"], s["kz_only_correct"]) == (7, 5, 1, 1)
    assert s["strict"]["kernelbench_ok_strict_not"] == 1
    table = (out / "agreement.txt").read_text()
    assert "agreement: 5 / 7 = 71.4%" in table and "disagreements: 2" in table
    assert "- run-p1-s3 (1_Relu): KernelBench ok, kz incorrect ['output_mismatch']" in table
    assert "kz: max abs diff 1.5" in table
    assert "timed out after" in table  # the hanging sample: kz ok, KernelBench past its timeout
    assert text.endswith(table)


def test_the_kz_batch_has_level_prefixed_tasks_and_the_report_keeps_no_sources(gpu_run):
    _, _, out, data = gpu_run
    assert sorted(p.name for p in (out / "kz" / "suite").iterdir()) == ["l1_1_Relu.py", "l2_1_Relu.py"]
    assert (out / "kz" / "candidates" / "c1" / "l1_1_Relu" / "run-p1-s0.py").exists()  # chunk 1
    assert all("ref_source" not in s and "build_dir" not in s and isinstance(s.get("origin"), dict)
               for s in data["samples"])
    assert data["source"] == "someone/KernelBench@000000000000"


def test_a_tight_budget_cuts_and_says_so(world, tmp_path):
    root, kb, samples, kz = world
    code, text = run_main(["--samples", samples, "--kernelbench", kb, "--kz", kz, "--out", tmp_path, "--device",
                           "cuda:0", "--kb-workers", "2", "--kb-timeout", KB_TIMEOUT_S, "--budget-s", "5", "--no-strict"])
    data = json.loads((tmp_path / "agreement.json").read_text())
    assert code == 0
    assert "cut by the budget" in data["notes"]["kb"] and data["kb"]["cut"]
    assert data["summary"]["no_kb_verdict"] >= 1
    assert data["notes"]["kz strict"] == "skipped (--no-strict)"


def test_sigterm_ends_the_evaluations_under_way_without_verdicts(world, tmp_path):
    """As `timeout` ends a call: the evaluation in flight (a thread's, beside the main one) is
    killed, and that kill is no verdict of KernelBench's; what was judged before it is kept."""
    root, kb, samples, kz = world
    state = tmp_path / "state"
    hanging = state / "kb-builds" / "run-p1-s6" / "hanging"

    def terminate_once_it_hangs():
        for _ in range(1200):
            if hanging.exists():
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.1)

    threading.Thread(target=terminate_once_it_hangs, daemon=True).start()
    with pytest.raises(SystemExit) as ended:
        run_main(["--samples", samples, "--kernelbench", kb, "--kz", kz, "--out", tmp_path / "out", "--device",
                  "cuda:0", "--kb-workers", "2", "--kb-timeout", KB_TIMEOUT_S, "--budget-s", "300", "--chunk", "4",
                  "--state", state, "--no-strict"])
    assert ended.value.code == 128 + signal.SIGTERM and hanging.exists()
    data = json.loads((tmp_path / "out" / "agreement.json").read_text())
    assert "interrupted" in data["notes"]
    assert "run-p1-s6" in data["kb"]["cut"]
    verdicts = agreement.State(state).done["kb-eval"]
    assert "run-p1-s6" not in verdicts and verdicts["run-p1-s0"]["class"] == "ok"


def test_report_only_prints_the_saved_table(gpu_run):
    _, _, out, _ = gpu_run
    code, text = run_main(["--report-only", out / "agreement.json"])
    assert code == 0 and text == (out / "agreement.txt").read_text()


# ---- --state: what earlier calls did ------------------------------------------------------------------

def some_samples(count):
    return [{"id": f"s{i}", "level": 1, "problem": "1_Relu"} for i in range(count)]


def test_the_state_reads_back_what_it_recorded(tmp_path):
    state = agreement.State(tmp_path / "state")
    state.record("kb-prebuild", "s0", {"built": True, "error": "", "compile_s": 3.0})
    state.record("kb-eval", "s0", {"compiled": True, "correctness": True, "class": "ok"})
    state.record("kz-kernelbench", "s1", {"status": "incorrect", "checks": ["output_mismatch"]})
    again = agreement.State(tmp_path / "state")
    assert again.done == state.done
    assert again.earlier == {"kb-prebuild": {"s0"}, "kb-eval": {"s0"}, "kz-kernelbench": {"s1"}, "kz-strict": set()}
    assert not again.unreadable and not list((tmp_path / "state").rglob("*.tmp"))


def test_samples_in_the_state_are_left_out_of_the_next_calls_work(tmp_path):
    state = agreement.State(tmp_path)
    samples = some_samples(6)
    state.record("kz-kernelbench", "s0", {"status": "ok"})
    state.record("kb-prebuild", "s1", {"built": True})  # built on another host: no folder here
    state.record("kb-prebuild", "s2", {"built": True})
    (state.builds / "s2").mkdir()
    state.record("kb-prebuild", "s3", {"built": True})
    state.record("kb-eval", "s3", {"class": "ok"})
    state.record("kb-eval", "s4", {"class": "compile_error"})
    assert [s["id"] for s in agreement.missing(samples, state, "kz-kernelbench")] == ["s1", "s2", "s3", "s4", "s5"]
    assert [s["id"] for s in agreement.to_prebuild(samples, state)] == ["s0", "s1", "s5"]
    assert [s["id"] for s in agreement.ready_for_kb(samples, state)] == ["s2"]
    assert agreement.eval_reserve_s(2, 4, 180) > agreement.eval_reserve_s(1, 4, 180)


def test_a_failed_pre_build_is_kernelbenchs_compile_error_unless_ours():
    failed = {"built": None, "error": "error: identifier undefined", "compile_s": 30.0}
    assert agreement.failed_prebuild(failed)
    verdict = agreement.prebuild_verdict(failed)
    assert verdict["class"] == "compile_error" and agreement.correct_kb(verdict) is False
    assert "identifier undefined" in agreement.kb_messages(verdict)
    assert not agreement.failed_prebuild({"built": True})
    assert not agreement.failed_prebuild({"built": None, "cut": True, "error": "stopped by the budget"})
    assert not agreement.failed_prebuild({"built": None, "error": "lock file exists, retry"})  # ours: built again


def test_kz_answers_about_memory_are_judged_again_unless_given_alone(tmp_path):
    state = agreement.State(tmp_path)
    held = {"status": "infra_error", "checks": ["gpu_memory_held_elsewhere"], "message": "held outside"}
    ran_out = {"status": "runtime_error", "checks": ["memory_limit"], "message": "CUDA out of memory. Tried"}
    state.record("kz-kernelbench", "s0", held)
    state.record("kz-kernelbench", "s1", ran_out)
    state.record("kz-kernelbench", "s2", dict(ran_out, judged_alone=True))  # the GPU to kz alone: it stands
    state.record("kz-kernelbench", "s3", {"status": "runtime_error", "checks": ["memory_limit"],
                                          "message": "RLIMIT_AS: the CPU's address space"})
    killed = "Command '['ninja', '-v', '-j', '16']' returned non-zero exit status 137."
    state.record("kz-kernelbench", "s4", {"status": "compile_error", "checks": ["kernel_compile"], "message": killed})
    state.record("kz-kernelbench", "s5", {"status": "compile_error", "checks": ["kernel_compile"],
                                          "message": "error: identifier \"C10_CUDA_KERNEL_LAUNCH_CHECK\" is undefined"})
    again = agreement.State(tmp_path)
    assert sorted(again.done["kz-kernelbench"]) == ["s2", "s3", "s5"]
    assert sorted(again.machine_answers) == ["s0", "s1", "s4"]
    assert "3 kz answers about the machine judged again" in agreement.state_note(again, some_samples(6))


def test_an_unreadable_state_file_is_ignored_and_named(tmp_path):
    state = agreement.State(tmp_path)
    state.record("kb-eval", "s0", {"class": "ok"})
    (tmp_path / "kb-eval" / "s1.json").write_text('{"class": "o')  # cut short by hand: the writes are atomic
    (tmp_path / "kz-strict" / "s2.json").write_text("[]")
    (tmp_path / "kb-eval" / ".s3.json.1.2.tmp").write_text("{")  # a write killed before its rename
    again = agreement.State(tmp_path)
    assert again.done["kb-eval"] == {"s0": {"class": "ok"}} and not again.done["kz-strict"]
    assert [line.split(":")[0] for line in again.unreadable] == ["kb-eval/s1.json", "kz-strict/s2.json"]
    assert not (tmp_path / "kb-eval" / ".s3.json.1.2.tmp").exists()
    note = agreement.state_note(again, some_samples(3))
    assert "1 evaluated by it" in note and "2 unreadable files ignored (done again): kb-eval/s1.json" in note


def test_a_second_call_goes_on_where_the_first_stopped(world, tmp_path):
    root, kb, samples, kz = world
    state = tmp_path / "state"
    common = ["--samples", samples, "--kernelbench", kb, "--kz", kz, "--device", "cuda:0", "--kb-workers", "2",
              "--kb-timeout", KB_TIMEOUT_S, "--budget-s", "300", "--state", state]
    code, text = run_main(common + ["--out", tmp_path / "first", "--limit", "3"])
    assert code == 0, text
    # s3 pre-built by a call that ended before evaluating it: the next call evaluates it first.
    agreement.State(state).record("kb-prebuild", "run-p1-s3", {"built": True, "error": "", "compile_s": 1.0})
    (state / "kb-builds" / "run-p1-s3").mkdir()
    code, text = run_main(common + ["--out", tmp_path / "second", "--limit", "6", "--chunk", "2"])
    data = json.loads((tmp_path / "second" / "agreement.json").read_text())
    assert code == 0, text
    new = ["run-p1-s3", "run-p1-s4", "run-p1-s5"]
    # kz's half of s3 first (KernelBench's is done), then chunk by chunk: [s3, s4], [s5].
    chunks = tmp_path / "second" / "kz" / "candidates"
    assert sorted(p.stem for p in (chunks / "c1").rglob("*.py")) == new[:2]
    assert sorted(p.stem for p in (chunks / "c2").rglob("*.py")) == new[2:]
    assert data["notes"]["chunks"] == "2 of up to 2 samples"
    assert list(data["kb"]["prebuild"]["samples"]) == new[1:]
    assert data["notes"]["kb, built earlier"].startswith("1 evaluated")
    assert "3 evaluated by it, 3 kz verdicts, 3 kz strict verdicts" in data["notes"]["state"]
    assert data["notes"]["tables"] == "6 samples judged by both sides, 3 of them entirely in earlier calls"
    rows = {r["id"]: r for r in data["rows"]}
    assert len(rows) == 6 and all(r["agree"] is not None and r["kz_strict"] for r in rows.values())
    assert rows["run-p1-s1"]["kb"] == "incorrect" and rows["run-p1-s3"]["agree"] is False
    assert not any((state / "kb-builds").iterdir())  # evaluated: their builds are needed no more


def test_the_memory_log_names_the_processes_holding_the_card():
    me = os.getpid()
    apps = f"{me}, 2048 MiB\n999999999, 70000 MiB\n{me + 1}, 10 MiB\nnot a row\n"
    holders = agreement.gpu_memory_holders(apps, most=2).split("; ")
    assert holders[0] == "999999999 70000 MiB ?"  # no such process here: named by its pid only
    assert holders[1].startswith(f"{me} 2048 MiB ") and "python" in holders[1]
    assert holders[2] == "1 more, 10 MiB"
    assert agreement.gpu_memory_holders("nvidia-smi: [Errno 2] No such file or directory") == ""
