"""bench/kernelbench_compare.py end to end on the CPU, with stand-ins for the two harnesses
(tests/fakes: a `kz eval-suite` that answers from file names, a `kernelbench` package that answers
from source markers), and its report on known numbers. The real harnesses run on the GPU host."""
import contextlib
import io
import json
import os
import pathlib
import stat
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FAKES = pathlib.Path(__file__).resolve().parent / "fakes"
sys.path.insert(0, str(ROOT / "bench"))
import compare_report  # noqa: E402
import kb_harness  # noqa: E402
import kernelbench_compare  # noqa: E402


@pytest.fixture(scope="module")
def fake_kz(tmp_path_factory):
    path = tmp_path_factory.mktemp("bin") / "kz"
    path.write_text(f"#!/bin/sh\nexec '{sys.executable}' '{FAKES / 'fake_kz.py'}' \"$@\"\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def run_main(argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = kernelbench_compare.main([str(a) for a in argv])
    return code, out.getvalue()


# ---- the whole pipeline with stand-ins -------------------------------------------------------------

@pytest.fixture(scope="module")
def toolchain(tmp_path_factory):
    """A small stand-in for the toolchain a run settles (torch, the CUDA toolkit: gigabytes)."""
    root = tmp_path_factory.mktemp("toolchain")
    (root / "include").mkdir()
    (root / "include" / "a.h").write_bytes(b"x" * 3000)
    (root / "lib.so").write_bytes(b"y" * (3 << 20))  # read in more than one chunk
    (root / "link.so").symlink_to(root / "lib.so")  # read once, not twice
    return root


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory, fake_kz, toolchain):
    out = tmp_path_factory.mktemp("run")
    real = kernelbench_compare.toolchain_dirs
    kernelbench_compare.toolchain_dirs = lambda args: [toolchain]
    try:
        code, text = run_main(["--kernelbench", FAKES / "kernelbench", "--kz", fake_kz, "--out", out, "--device",
                               "cuda:0", "--kb-limit", "4", "--kb-compile-workers", "2", "--budget-s", "900"])
    finally:
        kernelbench_compare.toolchain_dirs = real
    assert code == 0
    return out, text, json.loads((out / "compare.json").read_text())


def test_the_machine_is_settled_before_anything_is_timed(gpu_run):
    _, text, data = gpu_run
    settled = data["settle"]
    assert settled["files"] == 2 and settled["read_bytes"] == 3000 + (3 << 20) and settled["complete"]
    assert text.index("[compare] settled: sync") < text.index("[compare] kz ...")
    assert "both ran on a settled machine: dirty pages written out" in text


def test_the_toolchain_settled_holds_torchs_headers(tmp_path):
    dirs = kernelbench_compare.toolchain_dirs(kernelbench_compare.parse_args(["--skip", "kb", "--out", str(tmp_path)]))
    assert dirs and all(d.is_dir() for d in dirs)
    assert any((d / "include" / "torch").is_dir() for d in dirs), dirs


def test_every_phase_ran_and_was_saved(gpu_run):
    out, text, data = gpu_run
    assert set(data["phases"]) == {"kz", "kb", "stability", "ref", "kz rounds"}
    assert len(data["kz_batch"]["verdicts"]) == len(data["manifest"]) >= 32
    assert text.endswith((out / "report.txt").read_text())  # after the progress lines
    for log in ("kz-batch.txt", "kz-batch.err", "kb-prebuild.log", "kb-eval.log", "kz-stability.txt",
                "kz-batch-2.txt", "kz-batch-3.txt"):
        assert (out / log).exists(), log


def test_the_kz_batch_ran_three_times_cold_and_the_report_uses_the_median(gpu_run):
    _, text, data = gpu_run
    rounds = data["kz_rounds"]
    assert [r["round"] for r in rounds] == [1, 2, 3] and all(r["complete"] for r in rounds)
    walls = sorted(r["wall_s"] for r in rounds)
    assert data["kz_batch"]["wall_s"] == walls[1]
    assert text.index("[compare] kb ...") < text.index("[compare] kz rounds ...")  # round 1 before KernelBench
    assert f"kz: 3 cold batches (round 1 before KernelBench" in text
    chosen = data["kz_batch"]["round"]
    assert f"every table here is round {chosen}, the median by wall time of 3 complete cold kz batches" in text
    assert f"(round {chosen}, the median by wall time of 3 complete cold kz batches; each: " in text


def test_the_hosts_cpu_is_sampled_while_kz_runs(gpu_run):
    _, text, data = gpu_run
    cpu = data["kz_batch"]["host_cpu"]
    assert cpu["cores"] == os.cpu_count() and len(cpu["samples"]) >= 3
    assert all(0.0 <= busy <= 1.0 and 0.0 <= steal <= 1.0 for _, busy, steal in cpu["samples"])
    assert "host CPU while kz ran (" in text
    assert "CPU seconds (user + system, as each worker reported them): cuda pre-builds " in text
    assert data["kb"]["prebuild"]["host_cpu"]["cores"] == os.cpu_count()


def test_host_cpu_lines_average_and_bucket_the_samples():
    batch = {"host_cpu": {"cores": 16, "interval_s": 0.25,
                          "samples": [[0.25, 0.2, 0.0], [1.0, 0.4, 0.0], [2.5, 1.0, 0.1], [3.9, 0.8, 0.1]]}}
    line, = compare_report.host_cpu_lines(batch)
    assert "(16 cores, /proc/stat every 0.25 s): busy 60% on average, stolen by other guests 5.0%" in line
    assert line.endswith("busy per 2 s: 0-2 30%, 2-4 90%")
    assert compare_report.host_cpu_lines({}) == []


def test_the_first_wave_is_who_waited_out_the_zygotes_imports():
    def served(fmt, server):
        return {"format": fmt, "startup_s": {"server": server, "device": 0.5}}
    verdicts = [served("triton", 1.5), served("cuda-rtc", 1.4), served("cuda-rtc", 1.5), served("cuda-rtc", 0.2),
                served("cuda", 0.0), {"format": "cuda", "startup_s": None}, {"format": "triton"}]
    line, = compare_report.first_wave_lines(verdicts)
    assert "the zygote's imports): cuda-rtc 2 (2.9 s), triton 1 (1.5 s);" in line, "at least half the longest wait"
    assert compare_report.first_wave_lines([served("cuda", 0.0)]) == [], "nobody waited"
    assert compare_report.first_wave_lines([]) == []


def test_cpu_seconds_lines_add_each_formats_workers_and_the_pre_builds_against_the_host():
    batch = {"verdicts": [{"format": "cuda", "prebuild_cpu_s": 10.0, "cpu_s": {"worker": 0.5, "subprocesses": 0.0}},
                          {"format": "cuda", "prebuild_cpu_s": 12.0, "cpu_s": {"worker": 0.75, "subprocesses": 0.0}},
                          {"format": "cuda-rtc", "cpu_s": {"worker": 1.5, "subprocesses": 0.001}},
                          {"format": "cuda-rtc", "cpu_s": None},
                          {"format": "triton", "cpu_s": {"worker": 2.0, "subprocesses": 1.0}}],
             "host_cpu": {"cores": 4, "interval_s": 0.5, "samples": [[0.5, 1.0, 0.0], [1.0, 1.0, 0.0], [2.0, 0.5, 0.0]]}}
    line, = compare_report.cpu_seconds_lines(batch)
    assert "cuda pre-builds 22.0 (2: 11.00 each), cuda evaluations 1.2 (2: 0.62 each), cuda-rtc evaluations 1.5 (1: 1.50 each)," in line
    assert "triton evaluations 3.0 (1: 3.00 each; subprocesses 1.0); 27.8 in all" in line
    assert "of the host's 6.0 busy CPU-seconds while kz ran (the rest, 0.0:" in line, \
        "each sample weighted by the time since the one before; the rest never below zero"
    assert compare_report.cpu_seconds_lines({"verdicts": [{"format": "cuda", "cpu_s": None}]}) == [], "none reported"


def test_the_pre_builds_parts_are_medians_with_the_last_builds_beside():
    def build(prebuild_s, ninja_cuda, **extra):
        parts = {"worker_start": 1.0, "import_to_build": 0.5, "load_inline": prebuild_s - 2.0, "ninja": ninja_cuda + 0.5,
                 "ninja_cuda": ninja_cuda, "ninja_cpp": 2.0, "ninja_link": 0.5, **extra}
        return {"id": f"t/{prebuild_s}", "prebuild_s": prebuild_s, "build_s": parts}
    builds = [build(10.0, 6.0), build(12.0, 8.0), build(14.0, 10.0, nvcc_host_chain=4.0)]
    head, ninja, nvcc = compare_report.build_part_lines(builds + [{"id": "t/old", "prebuild_s": 9.0}], builds[2])
    assert "(median of 3, the last's in brackets): worker 1.0 [1.0], import 0.5 [0.5], load_inline 10.0 [12.0]" in head
    assert head.endswith("ninja 8.5 [10.5], the rest 0.5"), "prebuild_s less the worker's start, import and load_inline"
    assert ninja.endswith("nvcc 8.0 [10.0], main.cpp 2.0 [2.0], link 0.5 [0.5]")
    assert nvcc.endswith("host chain 4.0 [4.0]"), "a part is the median of the builds that report it"
    assert compare_report.build_part_lines([{"id": "t/old", "prebuild_s": 9.0}], {}) == [], "from before build_s"


def test_an_incomplete_round_is_listed_but_never_rated():
    def verdicts(wall):
        return [{"id": f"t/c{i}", "format": fmt, "wall_s": wall, "prebuild_s": None, "status": "ok"}
                for i, fmt in enumerate(["cuda", "cuda-rtc", "triton"])]
    done = {"round": 1, "wall_s": 10.0, "complete": True, "verdicts": verdicts(1.0)}
    cut = {"round": 2, "wall_s": 3.0, "complete": False, "verdicts": verdicts(0.5)[:1]}
    data = {"kz_rounds": [done, cut], "kz_batch": done,
            "kb": {"prebuild": {"wall_s": 60.0}, "eval": {"outcomes": [{"id": "t/c0", "wall_s": 6.0, "eval_s": 5.0}]}}}
    section = compare_report.rounds_section(data)
    assert "round 1, the only complete cold kz batch" in section
    assert section.splitlines()[-1].count("n/a (incomplete)") == 3
    goals = "\n".join(compare_report.goal_lines(data, 1.0))
    assert "each: " in goals and "n/a (incomplete)" in goals


def test_the_median_round_is_a_complete_one():
    runs = [{"round": 1, "wall_s": 10.0, "complete": True}, {"round": 2, "wall_s": 30.0, "complete": True},
            {"round": 3, "wall_s": 5.0, "complete": False}, {"round": 4, "wall_s": 20.0, "complete": True}]
    assert kernelbench_compare.median_round(runs)["round"] == 4
    assert kernelbench_compare.median_round(runs[:2])["round"] == 2  # of an even count the slower
    assert kernelbench_compare.median_round([runs[2]])["round"] == 3  # none complete: the first
    with pytest.raises(SystemExit):
        kernelbench_compare.parse_args(["--skip", "kb", "--kz-rounds", "0"])


def test_kernelbench_ran_the_first_cuda_candidates_its_way(gpu_run):
    _, _, data = gpu_run
    cuda = [r for r in data["manifest"] if r["format"] == "cuda"]
    kb = data["kb"]
    assert kb["samples"] == [r["id"] for r in cuda[:4]]
    assert set(kb["prebuild"]["samples"]) == set(kb["samples"]) and kb["prebuild"]["workers"] == 2
    outcomes = kb["eval"]["outcomes"]
    assert [o["id"] for o in outcomes] == kb["samples"]
    expected = {r["id"]: compare_report.KB_CLASS.get(r["expected"], r["expected"]) for r in cuda}
    assert all(o["class"] == expected[o["id"]] for o in outcomes), outcomes
    assert all(o["wall_s"] >= o["eval_s"] > 0 for o in outcomes)
    assert set(kb["setup"]["stubbed"]) >= {"dotenv", "openai", "litellm"} - installed()
    assert kb["loader_problems"] == []


def installed():
    import importlib.util
    return {m for m in ("dotenv", "openai", "litellm") if importlib.util.find_spec(m)}


def test_the_report_has_rates_ratios_stages_and_agreement(gpu_run):
    _, text, data = gpu_run
    assert "cands/min" in text and "vs KernelBench cuda" in text
    assert "goal cuda >= 10x KernelBench (on its 4 samples):" in text and "goal cuda-rtc >= 50x KernelBench:" in text
    assert f"verdicts: kz {len(data['manifest'])}/{len(data['manifest'])} as expected" in text
    assert "KernelBench 4/4 as expected" in text
    assert "timing stability: 07_softmax (cuda-rtc) in 5 separate kz evaluations" in text
    assert "reference as its own candidate (--format torch): 20 tasks" in text
    assert "load_reference" in text and "pre-build+start" in text
    assert "timeline (s from the batch's start" in text and "cuda pre-builds 0.2-0.3; the last to end" in text
    assert "kz's own: set-up 0.20 s before the batch" in text and "shut-down 0.00 s (0 fork servers ended" in text
    cuda = [v for v in data["kz_batch"]["verdicts"] if v["format"] == "cuda"]
    assert all((v["prebuild_s"] is None) == (v["status"] == "compile_error") for v in cuda), "kept from kz's verdicts"


def test_report_only_reprints_a_saved_run(gpu_run):
    out, text, _ = gpu_run
    code, again = run_main(["--report-only", out / "compare.json"])
    assert code == 0 and again == (out / "report.txt").read_text() and text.endswith(again)


def test_cpu_run_prebuilds_kernelbench_only_and_skips_timing_phases(tmp_path, fake_kz):
    code, text = run_main(["--kernelbench", FAKES / "kernelbench", "--kz", fake_kz, "--out", tmp_path,
                           "--device", "cpu", "--kb-limit", "2", "--kb-compile-workers", "2", "--no-settle"])
    data = json.loads((tmp_path / "compare.json").read_text())
    assert "settle" not in data and "the machine was not settled first (--no-settle" in text
    assert code == 0 and set(data["phases"]) == {"kz", "kb"}
    assert "eval" not in data["kb"] and len(data["kb"]["prebuild"]["samples"]) == 2
    assert "pre-build only" in text and "not measured (needs a GPU)" in text
    assert "compiled_not_run" in text  # cuda / cuda-rtc candidates that compile, on a CPU machine


class FixedBudget:
    deadline = 1.0  # a budget is set

    def __init__(self, seconds):
        self.seconds = seconds

    def left(self):
        return self.seconds


def test_a_small_budget_cuts_the_later_phases_and_says_so(tmp_path, fake_kz):
    args = kernelbench_compare.parse_args(["--kz", str(fake_kz), "--out", str(tmp_path), "--skip", "kb"])
    # 7 s per evaluation, 4 of them in 20 s: kz ran them concurrently, 5 s of batch time each.
    data = {"kz_batch": {"wall_s": 20.0, "verdicts": [{"status": "ok", "wall_s": 7.0}] * 4}}
    kernelbench_compare.phase_stability(args, data, FixedBudget(30), tmp_path / "cache")
    assert data["stability"]["note"] == "skipped: 30 s left, 46 s needed"  # (5 runs x 5 s + 10) x 1.3
    kernelbench_compare.phase_ref(args, data, FixedBudget(40), tmp_path / "cache")
    ref = data["ref_as_candidate"]
    assert len(ref["verdicts"]) == 4 and len(ref["skipped"]) == 16  # (4 x 5 + 10) x 1.15 <= 40 < (5 x 5 + 10) x 1.15
    assert "not run (time budget): " in compare_report.reference_section(data)
    kernelbench_compare.phase_ref(args, data, FixedBudget(12), tmp_path / "cache")
    assert data["ref_as_candidate"]["note"].startswith("skipped")


def test_a_failing_phase_is_reported_and_the_rest_runs(tmp_path, fake_kz):
    code, text = run_main(["--kernelbench", tmp_path, "--kz", fake_kz, "--out", tmp_path / "out", "--device", "cpu",
                           "--no-settle"])
    data = json.loads((tmp_path / "out" / "compare.json").read_text())
    assert code == 0 and len(data["kz_batch"]["verdicts"]) == len(data["manifest"])
    assert "kb: FAILED: ValueError:" in text and "not a KernelBench checkout" in text


def test_dry_run_checks_loaders_and_times_nothing(tmp_path, fake_kz):
    code, text = run_main(["--kernelbench", FAKES / "kernelbench", "--kz", fake_kz, "--out", tmp_path,
                           "--dry-run", "--device", "cpu"])
    assert code == 0 and "KernelBench loaders: compatible" in text
    assert not (tmp_path / "kz-batch.jsonl").exists()
    assert (tmp_path / "batch" / "manifest.jsonl").exists()


# ---- arguments ---------------------------------------------------------------------------------

def test_kernelbench_path_is_required_unless_skipped(capsys):
    with pytest.raises(SystemExit):
        kernelbench_compare.parse_args([])
    assert "fetch-kernelbench.sh" in capsys.readouterr().err
    assert kernelbench_compare.parse_args(["--skip", "kb"]).skip == {"kb"}
    with pytest.raises(SystemExit):
        kernelbench_compare.parse_args(["--skip", "kb,warmup"])


def test_a_folder_that_is_not_kernelbench_says_how_to_get_it(tmp_path):
    with pytest.raises(ValueError, match="fetch-kernelbench.sh"):
        kb_harness.source_dir(tmp_path)


# ---- KernelBench side, pieces --------------------------------------------------------------------

def test_pydantic_stand_in_gives_each_instance_its_own_defaults():
    namespace = {}
    exec(kb_harness.STUBS["pydantic"], namespace)

    class Result(namespace["BaseModel"]):
        compiled: bool = False
        metadata: dict = {}

    first, second = Result(compiled=True), Result()
    first.metadata["x"] = 1
    assert first.compiled and not second.compiled and second.metadata == {}


def test_stubs_only_for_missing_modules(tmp_path):
    stubbed = kb_harness.install_stubs(tmp_path)
    assert "json" not in stubbed and all((tmp_path / f"{name}.py").exists() for name in stubbed)
    assert not (tmp_path / "pydantic.py").exists() or "pydantic" in stubbed


@pytest.mark.parametrize("outcome, expected", [
    ({"compiled": True, "correctness": True}, "ok"),
    ({"compiled": True, "correctness": False, "metadata": {"runtime_error": "x"}}, "runtime_error"),
    ({"compiled": True, "correctness": False, "metadata": {}}, "incorrect"),
    ({"compiled": False, "correctness": False}, "compile_error"),
    ({"compiled": False, "timeout": True}, "timeout"),
])
def test_kernelbench_outcomes_map_to_statuses(outcome, expected):
    assert kb_harness.verdict_class(outcome) == expected


def test_a_hanging_sample_times_out_and_the_next_still_runs(tmp_path):
    kb_harness.prepare(FAKES / "kernelbench", tmp_path / "stubs")
    samples = [{"id": f"t/{name}", "source": source, "ref_source": "", "build_dir": str(tmp_path / name)}
               for name, source in (("hang", "FAKE_HANG"), ("fine", "class ModelNew: pass"))]
    for s in samples:
        pathlib.Path(s["build_dir"]).mkdir()
        (pathlib.Path(s["build_dir"]) / "built").write_text("")
    settings = {"correct_trials": 5, "perf_trials": 100, "timeout_s": 15, "min_eval_s": 1}
    result = kb_harness.evaluate_all(samples, settings, "Hopper", tmp_path / "log", float("inf"))
    assert [o["class"] for o in result["outcomes"]] == ["timeout", "ok"]
    assert result["outcomes"][0]["wall_s"] < 60


# ---- the report on known numbers ---------------------------------------------------------------------

def synthetic():
    manifest = [{"id": f"t{i}/{fmt}__correct", "task": f"t{i}", "format": fmt, "kind": "correct", "expected": "ok"}
                for i, fmt in enumerate(["cuda", "cuda", "cuda-rtc", "triton"])]
    verdicts = [{"id": r["id"], "task": r["task"], "format": r["format"], "status": "ok", "wall_s": 5.0,
                 "stage_s": {"startup": 2.0, "load_reference": 1.0, "compile": 0.5, "correctness": 0.5,
                             "timing": 0.5, "recheck": 0.25}, "speedup": 1.1} for r in manifest]
    return {"settings": {"device": "cuda:0", "gpu": "NVIDIA H200", "kb_limit": 2, "kb_workers": 16,
                         "kb_gpu_arch": "Hopper"},
            "manifest": manifest,
            # 4 evaluations of 5 s, 40 s of wall: 20 s outside them, charged to cuda.
            "kz_batch": {"wall_s": 40.0, "verdicts": verdicts},
            # KernelBench: 60 s pre-build + 2 x 10 s = 80 s for 2 candidates = 1.5 per minute.
            "kb": {"setup": {"commit": "abc", "stubbed": []}, "prebuild": {"wall_s": 60.0},
                   "eval": {"outcomes": [{"id": manifest[0]["id"], "class": "ok", "wall_s": 10.0, "eval_s": 6.0},
                                         {"id": manifest[1]["id"], "class": "ok", "wall_s": 10.0, "eval_s": 6.0}]}},
            "stability": {"task": "t2", "format": "cuda-rtc",
                          "verdicts": [{"runtime_ms": x, "ref_runtime_ms": 0.2, "speedup": 0.2 / x} for x in (0.1, 0.11)]},
            "ref_as_candidate": {"verdicts": [{"task": "t0", "speedup": 0.99}, {"task": "t1", "speedup": 1.02}],
                                 "skipped": ["t3"]}}


def test_rates_and_ratios_on_known_numbers():
    data = synthetic()
    times = compare_report.kz_format_times(data)
    assert times["cuda"] == {"count": 2, "seconds": 30.0}      # 2 x 5 s + the 20 s outside evaluations
    assert times["cuda-rtc"] == {"count": 1, "seconds": 5.0}
    assert compare_report.kb_totals(data)["seconds"] == 80.0
    text = compare_report.render(data)
    # cuda: 2 per 30 s = 4.0/min against 1.5/min; cuda-rtc: 12.0/min = 8.00x.
    assert "4.0" in text and "2.67x" in text and "8.00x" in text
    # Without the pre-build: kz cuda 2 per 10 s = 12/min, KernelBench 2 per 20 s = 6/min.
    kz_cuda_row = next(line for line in text.splitlines() if line.startswith("kz           cuda "))
    assert kz_cuda_row.split()[-2:] == ["12.0", "2.00x"], kz_cuda_row
    # The goal compares the same samples: kz's 2 KernelBench samples took 10 s + the 20 s outside.
    assert "goal cuda >= 10x KernelBench (on its 2 samples): 2.67x, NOT met" in text
    assert "max/min" in text and "1.100" in text
    assert "0.990x to 1.020x" in text and "not run (time budget): t3" in text
    assert "KernelBench: parallel pre-build 60.0 s; 2 evaluations 20.0 s, of which 12.0 s inside" in text
    assert "that failed (in the parallel" not in text and "whose pre-build had failed" not in text


def test_a_goal_on_a_run_the_time_budget_cut_short_says_it_is_provisional():
    data = synthetic()
    assert "provisional" not in compare_report.render(data), "a full run's goals are no one's guess"
    data["kb"]["eval"]["skipped"] = ["t2/cuda-rtc__correct"]
    data["phases"] = {"kz rounds": {"note": "1 of 3 cold batches: 13 s left, 27 s needed for another"}}
    goals = [line for line in compare_report.render(data).splitlines() if line.startswith("goal ")]
    assert len(goals) == 2
    for line in goals:
        assert line.endswith("; provisional, cut short by the time budget: KernelBench on 2 of its 3 samples, "
                             "kz 1 of 3 cold batches"), line


def test_concurrent_evaluations_share_the_batch_wall_time():
    # kz ran its 4 evaluations of 5 s at once ([tuning] gpu_jobs): 10 s of wall for 20 s of work.
    data = synthetic()
    data["kz_batch"]["wall_s"] = 10.0
    assert compare_report.kz_overlap_scale(data) == 0.5
    times = compare_report.kz_format_times(data)
    assert times["cuda"] == {"count": 2, "seconds": 5.0}       # half of 2 x 5 s, nothing outside
    assert sum(t["seconds"] for t in times.values()) == 10.0    # the formats add up to the batch
    # cuda: 2 per 5 s = 24/min against KernelBench's 1.5/min.
    assert "goal cuda >= 10x KernelBench (on its 2 samples): 16.00x, met" in compare_report.render(data)
    assert "concurrently" in compare_report.render(data)


def test_cuda_carries_its_own_pre_build():
    # The cuda pre-builds (15 s each) ran beside the 4 evaluations of 5 s: 50 s of work in 20 s of wall.
    data = synthetic()
    for v in data["kz_batch"]["verdicts"][:2]:
        v["prebuild_s"] = 15.0
    data["kz_batch"]["wall_s"] = 20.0
    assert compare_report.kz_overlap_scale(data) == pytest.approx(0.4)
    times = compare_report.kz_format_times(data)
    assert times["cuda"]["seconds"] == pytest.approx(16.0)      # (5 + 15 s) x 2 x 0.4
    assert times["cuda-rtc"]["seconds"] == pytest.approx(2.0)   # 5 s x 0.4, no pre-build of its own
    assert sum(t["seconds"] for t in times.values()) == pytest.approx(20.0)
    # KernelBench's samples: their own 20 s each, the other cuda candidates' pre-builds too (none here).
    assert compare_report.kz_subset_seconds(data, {data["manifest"][0]["id"]}) == pytest.approx((20.0 + 15.0) * 0.4)
    text = compare_report.render(data)
    assert "summed wall_s + prebuild_s x 0.400; cuda carries its own pre-build" in text
    cuda_stages = next(line for line in text.splitlines() if line.startswith("cuda "))
    assert cuda_stages.split()[-2:] == ["30.0", "40.0"], cuda_stages  # pre-build+start, total


def test_rebuilds_of_failed_builds_are_named():
    data = synthetic()
    data["kz_batch"]["verdicts"][1].update(status="compile_error", checks=["kernel_compile"])
    data["kb"]["prebuild"]["samples"] = {data["manifest"][1]["id"]: {"built": False}}
    text = compare_report.stage_section(data)
    assert "0.5 s went to 1 load_inline build(s) that failed" in text
    assert "6.0 s of its evaluations went to 1 sample(s) whose pre-build had failed" in text
    short = compare_report.short_report(data)
    assert "KernelBench cuda" in short and "kz cuda-rtc" in short and "goal cuda-rtc >= 50x" in short
    assert "timing stability: t2 (cuda-rtc) in 2 separate kz evaluations: candidate median max/min 1.100" in short
    assert "reference as its own candidate (--format torch): 2 tasks" in short


def test_report_of_an_empty_run_does_not_fail():
    text = compare_report.render({"settings": {"device": "cpu"}, "manifest": []})
    assert "not measured" in text


def test_worker_readiness_and_gpu_lock_are_summed():
    data = synthetic()
    for verdict, startup in zip(data["kz_batch"]["verdicts"], (0.0, 0.1, 3.0, 7.5)):
        verdict["stage_s"]["startup"] = startup
        verdict.update(gpu_wait_s=1.5, gpu_exclusive_s=0.25)
    text = compare_report.stage_section(data)
    assert "workers: 2 of 4 evaluations found theirs ready" in text and "the other 2 waited 3.0-7.5 s" in text
    assert "6.0 s waiting for it" in text
    # Per format, against its verdicts' summed wall_s (cuda 2 x 5 s, the others one each).
    assert "waiting per format (share of its verdicts' summed wall_s): cuda 3.0 s (30%), cuda-rtc 1.5 s (30%), " \
           "triton 1.5 s (30%)" in text, text
    # Where startup_s says where the start-up went, a wait for a server or a device counts, however short.
    starts = ({"server": 0.0, "device": 0.0}, {"server": 0.0, "device": 0.7}, {"server": 1.5, "device": 1.0}, {})
    for verdict, parts, startup in zip(data["kz_batch"]["verdicts"], starts, (0.05, 0.8, 2.6, 7.5)):
        verdict["stage_s"]["startup"] = startup
        verdict["startup_s"] = parts
    text = compare_report.stage_section(data)
    assert "workers: 1 of 4 evaluations found theirs ready" in text and "the other 3 waited 0.8-7.5 s" in text, text and "1.0 s held exclusive by timings = 2% of the batch's 40 s" in text


def test_verdicts_without_a_worker_and_the_launch_spins_are_counted():
    data = synthetic()
    verdicts = data["kz_batch"]["verdicts"]
    for verdict, spin in zip(verdicts, ("gated", "gated", "fixed", None)):
        verdict.update(stage="recheck", launch_spin=spin)
    verdicts += [{"id": "t5/cuda-rtc__python_syntax", "task": "t5", "format": "cuda-rtc", "status": "compile_error",
                  "stage": "syntax_check", "stage_s": {}, "wall_s": 0.002, "speedup": None},
                 {"id": "t6/triton__no_model_new", "task": "t6", "format": "triton", "status": "format_error",
                  "stage": "", "stage_s": {}, "wall_s": 0.0, "speedup": None}]
    text = compare_report.stage_section(data)
    assert "  decided without a worker: 2 (format 1, syntax_check 1), 0.002 s at most each" in text, text
    assert "  launch spins: fixed in 1, gated in 2, not recorded in 1 of 4 timings" in text, text


def test_the_startups_waits_are_summed_per_format():
    data = synthetic()
    verdicts = data["kz_batch"]["verdicts"]
    # cuda: the first waits 1.5 s for its server and 0.25 s for its child's device; the second finds both ready
    verdicts[0]["startup_s"] = {"server": 1.5, "device": 0.25, "device_context": 0.5, "device_profiler": 0.125}
    verdicts[1]["startup_s"] = {"server": 0.0, "device": 0.0}
    text = compare_report.stage_section(data)
    assert ("  cuda startup (2 served by fork servers): waiting for a server 1.5 s (the longest 1.5 s: the zygote's "
            "imports, the first time), for the child's device 0.2 s, the rest 2.2 s") in text
    assert "    the device's preparation where a request waited for it: context 0.5 s, profiler 0.1 s" in text
    assert "cuda-rtc startup" not in text, "a verdict without startup_s (a worker of its own) is not counted"


def test_startups_in_processes_of_their_own_are_reported_apart():
    data = synthetic()
    by_format = {v["format"]: v for v in data["kz_batch"]["verdicts"]}
    # a worker started for the request: its own imports, then the device it made meanwhile
    by_format["cuda-rtc"]["startup_s"] = {"imports": 1.5, "device": 0.25, "early_context": 1.0,
                                          "device_context": 0.125}
    by_format["triton"]["startup_s"] = {"server": 0.5, "device": 0.0}
    text = compare_report.stage_section(data)
    assert ("  cuda-rtc startup (1 in workers started for them): imports 1.5 s, then "
            "waiting for the device 0.2 s (its context made during the imports: 1.0 s), the rest 0.2 s") in text
    assert "    the device's preparation where a request waited for it: context 0.1 s" in text
    assert "  triton startup (1 served by fork servers): waiting for a server 0.5 s" in text
    assert "cuda-rtc startup (1 served" not in text


def test_correctness_parts_are_summed_per_format():
    data = synthetic()
    for verdict in data["kz_batch"]["verdicts"]:
        verdict["correctness_s"] = {"audit": 0.5, "trials": 0.25, "replay_probe": 0.125}
    formats = {v["format"] for v in data["kz_batch"]["verdicts"]}
    text = compare_report.stage_section(data)
    for fmt in formats:
        n = sum(1 for v in data["kz_batch"]["verdicts"] if v["format"] == fmt)
        assert f"  {fmt} correctness: audit {0.5 * n:.1f} s, replay_probe {0.125 * n:.1f} s, trials {0.25 * n:.1f} s" in text


def test_compile_parts_are_summed_per_format_with_nvrtc_only_where_reported():
    data = synthetic()
    verdicts = data["kz_batch"]["verdicts"]
    for verdict in verdicts:
        verdict["compile_s"] = {"import": 0.25, "construct": 0.5, "to_device": 0.125}
        if verdict["format"] == "cuda-rtc":
            verdict["compile_s"]["nvrtc"] = 0.375
    text = compare_report.stage_section(data)
    for fmt in {v["format"] for v in verdicts}:
        n = sum(1 for v in verdicts if v["format"] == fmt)
        nvrtc = f", nvrtc {0.375 * n:.1f} s" if fmt == "cuda-rtc" else ""
        assert (f"  {fmt} compile (nvrtc: inside import and construct): construct {0.5 * n:.1f} s, "
                f"import {0.25 * n:.1f} s{nvrtc}, to_device {0.125 * n:.1f} s") in text


def test_load_reference_parts_and_the_waits_by_stage_are_summed_per_format():
    data = synthetic()
    verdicts = data["kz_batch"]["verdicts"]
    for verdict in verdicts:
        verdict["load_reference_s"] = {"import": 0.125, "build": 0.25, "inputs": 1.0, "warm_up": 0.0625}
        verdict["gpu_wait_s"] = 0.75
        verdict["gpu_wait_by_stage_s"] = {"load_reference": 0.5, "correctness": 0.25}
    text = compare_report.stage_section(data)
    for fmt in {v["format"] for v in verdicts}:
        n = sum(1 for v in verdicts if v["format"] == fmt)
        assert (f"  {fmt} load_reference: build {0.25 * n:.1f} s, import {0.125 * n:.1f} s, "
                f"inputs {1.0 * n:.1f} s, warm_up {0.0625 * n:.1f} s") in text
        assert f"    {fmt} waiting by stage: correctness {0.25 * n:.1f} s, load_reference {0.5 * n:.1f} s" in text


def test_timing_parts_are_summed_per_format():
    data = synthetic()
    timed = [v for v in data["kz_batch"]["verdicts"] if v.get("speedup")]
    assert timed, "the synthetic batch has timed verdicts"
    for verdict in timed:
        verdict["timing_s"] = {"inputs": 0.5, "warmup": 0.25, "timed": 1.0}
    text = compare_report.stage_section(data)
    for fmt in {v["format"] for v in timed}:
        n = sum(1 for v in timed if v["format"] == fmt)
        assert f"  {fmt} timing (exclusive): inputs {0.5 * n:.1f} s, timed {1.0 * n:.1f} s, warmup {0.25 * n:.1f} s" in text


def test_the_timings_checks_after_the_hold_are_summed_apart_from_the_hold():
    data = synthetic()
    timed = [v for v in data["kz_batch"]["verdicts"] if v.get("speedup")]
    for verdict in timed:
        verdict["timing_s"] = {"checks": 0.5, "timed": 1.0}
        verdict["timing_after_hold_s"] = {"checks": 2.0}
    text = compare_report.stage_section(data)
    for fmt in {v["format"] for v in timed}:
        n = sum(1 for v in timed if v["format"] == fmt)
        assert f"  {fmt} timing (exclusive): checks {0.5 * n:.1f} s, timed {1.0 * n:.1f} s" in text
        assert f"  {fmt} timing (after the hold, shared): checks {2.0 * n:.1f} s" in text


def test_a_verdict_with_a_check_that_could_not_run_is_marked():
    data = synthetic()
    verdict = data["kz_batch"]["verdicts"][0]
    kept = kernelbench_compare.trim({"candidate": "batch/candidates/t1/cuda__correct.py", "status": "ok",
                                     "unchecked": {"no_custom_kernel": "the profiler listed no kernel"}})
    verdict["unchecked"] = kept["unchecked"]  # what the compare keeps of kz's verdict
    text = compare_report.agreement_section(data)
    assert f"{verdict['status']} (unchecked: no_custom_kernel)" in text, text
    assert text.count("unchecked") == 1, text
