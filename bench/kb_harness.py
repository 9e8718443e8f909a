"""KernelBench's side of bench/kernelbench_compare.py: its own evaluation code, driven the way its
batch script (scripts/eval_from_generations.py) drives it.

That script, in its local mode with `build_cache=True`, first builds every kernel in a pool of
`num_cpu_workers` processes (kernelbench.compile.batch_compile -> kernelbench.eval.build_compile_cache,
one TORCH_EXTENSIONS_DIR per sample), then evaluates the samples one at a time, each in a fresh
spawned process (multiprocessing.Pool(1), a timeout per sample), with
kernelbench.eval.eval_kernel_against_ref (5 correctness trials, 100 timed trials with cuda events,
fp32, the reference timed as well). This module repeats that flow around the same library
functions; nothing of KernelBench is copied here: the checkout's path is given at run time.

KernelBench's package imports LLM clients at import time (kernelbench/__init__ -> utils: dotenv,
tqdm, openai, litellm; eval: requests, pydantic) that its evaluation never calls. On a machine
without them (the GPU host has no network) `install_stubs` provides minimal stand-ins for the
missing ones only, and says which.
"""
import importlib.util
import multiprocessing
import os
import pathlib
import sys
import tempfile
import time
import traceback

# Minimal stand-ins for modules KernelBench imports but does not use to evaluate. Only the names
# its modules reference at import time, or use on the evaluation path (pydantic.BaseModel for
# KernelExecResult, tqdm for progress bars).
STUBS = {
    "dotenv": "def load_dotenv(*args, **kwargs):\n    return False\n",
    "openai": "class OpenAI:\n    def __init__(self, *args, **kwargs):\n"
              "        raise RuntimeError('openai is a stub here: no LLM calls in this benchmark')\n",
    "litellm": "def completion(*args, **kwargs):\n"
               "    raise RuntimeError('litellm is a stub here: no LLM calls in this benchmark')\n",
    "requests": "",
    "tqdm": (
        "class tqdm:\n"
        "    def __init__(self, iterable=None, *args, **kwargs):\n        self.iterable = iterable\n"
        "    def __iter__(self):\n        return iter(self.iterable or ())\n"
        "    def __enter__(self):\n        return self\n"
        "    def __exit__(self, *exc):\n        return False\n"
        "    def update(self, n=1):\n        pass\n"
        "    def close(self):\n        pass\n"),
    "pydantic": (
        "import copy\n\n\n"
        "class BaseModel:\n"
        "    \"\"\"Fields from class annotations, defaults deep-copied per instance, keywords set.\"\"\"\n"
        "    def __init__(self, **values):\n"
        "        for cls in reversed(type(self).__mro__):\n"
        "            for name in getattr(cls, '__annotations__', {}):\n"
        "                if name in cls.__dict__:\n"
        "                    setattr(self, name, copy.deepcopy(cls.__dict__[name]))\n"
        "        for name, value in values.items():\n"
        "            setattr(self, name, value)\n\n"
        "    def model_dump(self):\n        return dict(vars(self))\n\n"
        "    def __repr__(self):\n        return f'{type(self).__name__}({vars(self)})'\n"),
}

HOW_TO_GET_IT = (
    "KernelBench is not part of this repository. On a machine with network:\n"
    "    bench/fetch-kernelbench.sh            # clones it into .kb/KernelBench (ignored by git)\n"
    "then pass --kernelbench .kb/KernelBench (carry .kb/ to a GPU host without network).")


def source_dir(checkout: pathlib.Path) -> pathlib.Path:
    """The folder that holds the `kernelbench` package; ValueError says how to get one."""
    for candidate in (checkout / "src", checkout):
        if (candidate / "kernelbench" / "eval.py").is_file():
            return candidate.resolve()
    raise ValueError(f"{checkout} is not a KernelBench checkout (no src/kernelbench/eval.py).\n{HOW_TO_GET_IT}")


def install_stubs(stub_root: pathlib.Path) -> list:
    """Writes stand-ins for the missing modules of STUBS under stub_root and puts it on sys.path
    (after the real site-packages: a real module always wins). Returns the stubbed names."""
    missing = [name for name in STUBS if importlib.util.find_spec(name) is None]
    stub_root.mkdir(parents=True, exist_ok=True)
    for name in missing:
        (stub_root / f"{name}.py").write_text(STUBS[name])
    if missing and str(stub_root) not in sys.path:
        sys.path.append(str(stub_root))
    return missing


def prepare(checkout: pathlib.Path, stub_root: pathlib.Path) -> dict:
    """Makes `import kernelbench` work in this process and in the processes it spawns (they
    inherit sys.path). Returns what was done, for the report."""
    src = source_dir(checkout)
    if str(src) not in sys.path:
        sys.path.insert(0, str(src))
    stubbed = install_stubs(stub_root)
    return {"source": str(src), "commit": _git_commit(checkout), "stubbed": stubbed}


def _git_commit(checkout: pathlib.Path) -> str:
    head = checkout / ".git" / "HEAD"
    try:
        ref = head.read_text().strip()
        if ref.startswith("ref: "):
            return (checkout / ".git" / ref[5:]).read_text().strip()[:12]
        return ref[:12]
    except OSError:
        return "unknown"


# ---- loader compatibility (no GPU needed) --------------------------------------------------------

def check_loaders(references: dict, candidates: list, call_get_inputs: bool) -> list:
    """Loads every reference with KernelBench's load_original_model_and_inputs and parses every
    candidate the way its load_custom_model does first; for the tasks of `candidates`, checks that
    the reference has no parameters (KernelBench gives ModelNew only the seed, not the weights).
    Returns problems, one line each; empty when all is compatible."""
    import torch
    from kernelbench import eval as kb_eval
    problems = []
    for task, source in sorted(references.items()):
        loaded = kb_eval.load_original_model_and_inputs(source, {})
        if not loaded or not all(loaded):
            problems.append(f"{task}: KernelBench's loader found no Model/get_inputs/get_init_inputs")
            continue
        model_class, get_init_inputs, get_inputs = loaded
        init_inputs = get_init_inputs()
        if call_get_inputs and not all(isinstance(x, (torch.Tensor, int, float)) for x in get_inputs()):
            problems.append(f"{task}: get_inputs() returns something other than tensors and numbers")
        if task in {c["task"] for c in candidates}:
            with torch.no_grad():
                model = model_class(*init_inputs)
            if any(True for _ in model.parameters()) or any(True for _ in model.buffers()):
                problems.append(f"{task}: the reference has parameters; KernelBench does not copy them into "
                                "ModelNew, so a correct candidate must initialise them identically from the seed")
    for candidate in candidates:
        try:
            compile(candidate["source"], "<string>", "exec")
        except SyntaxError:
            if candidate["expected"] != "compile_error":
                problems.append(f"{candidate['id']}: not valid Python for KernelBench's loader")
    return problems


# ---- the batch, KernelBench's way ----------------------------------------------------------------

def _child_init(log_path: str, gpu_arch: str) -> None:
    """In each spawned process: its output (nvcc and ninja included) to a log, and the build
    architecture set by KernelBench's own set_gpu_arch, as its scripts do. Never raises: a pool
    replaces a worker whose initializer failed, forever; the task itself reports the failure."""
    try:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        from kernelbench import utils
        utils.set_gpu_arch([gpu_arch])
    except Exception:  # noqa: BLE001
        traceback.print_exc()


def compile_one(kernel_src: str, build_dir: str) -> dict:
    """One sample of KernelBench's parallel pre-build (compile.compile_single_sample's work)."""
    from kernelbench import eval as kb_eval
    started = time.perf_counter()
    try:
        built, _, error = kb_eval.build_compile_cache(custom_model_src=kernel_src, verbose=False,
                                                      build_dir=build_dir)
    except Exception as exc:  # its own last-level catch
        built, error = None, f"{type(exc).__name__}: {exc}"
    return {"built": built, "error": str(error or "")[:300], "compile_s": time.perf_counter() - started}


def evaluate_one(ref_src: str, kernel_src: str, build_dir: str, settings: dict) -> dict:
    """One sample of KernelBench's batch evaluation (evaluate_single_sample's work), in its own
    spawned process; eval_s is the time inside eval_kernel_against_ref. settings: correct_trials,
    perf_trials, and optionally measure_performance (default True), device (default cuda:0) and
    metadata_chars (how much of each metadata value is kept, default 300)."""
    import torch
    from kernelbench import eval as kb_eval
    started = time.perf_counter()
    try:
        result = kb_eval.eval_kernel_against_ref(
            original_model_src=ref_src, custom_model_src=kernel_src,
            num_correct_trials=settings["correct_trials"], num_perf_trials=settings["perf_trials"],
            measure_performance=settings.get("measure_performance", True), timing_method="cuda_event",
            verbose=False, build_dir=build_dir, device=torch.device(settings.get("device", "cuda:0")), backend="cuda",
            precision=kb_eval.get_torch_dtype_from_string("fp32"))
        summary = summarize(result, settings.get("metadata_chars", 300))
    except Exception as exc:  # its batch script counts these as not compiled
        summary = {"compiled": False, "correctness": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    summary["eval_s"] = time.perf_counter() - started
    return summary


def summarize(result, metadata_chars: int = 300) -> dict:
    """KernelExecResult -> plain data (None: its 'lock file, please retry' answer)."""
    if result is None:
        return {"compiled": False, "correctness": False, "error": "KernelBench returned None (lock file; retry)"}
    metadata = {str(k): str(v)[:metadata_chars] for k, v in (result.metadata or {}).items()}
    return {"compiled": bool(result.compiled), "correctness": bool(result.correctness),
            "runtime_ms": result.runtime, "ref_runtime_ms": result.ref_runtime,
            "runtime_stats": dict(result.runtime_stats or {}), "metadata": metadata}


def verdict_class(outcome: dict) -> str:
    """KernelBench's outcome in the batch's status vocabulary (it cannot tell a format error from a
    compile error: both are compiled=False)."""
    if outcome.get("timeout"):
        return "timeout"
    if not outcome.get("compiled"):
        return "compile_error"
    if outcome.get("correctness"):
        return "ok"
    return "runtime_error" if "runtime_error" in outcome.get("metadata", {}) else "incorrect"


def prebuild(samples: list, workers: int, gpu_arch: str, log_path: pathlib.Path, deadline: float,
             on_result=None, stop_early=None) -> dict:
    """All samples built at once in a pool of `workers` processes, until the deadline or until
    stop_early() says so (checked every half second). on_result(id, result) gets each result as soon
    as it exists. Returns per-sample results (by id; those not built in time have "cut": True) and
    the phase's wall time."""
    context = multiprocessing.get_context("spawn")
    started = time.monotonic()
    results = {}
    pool = context.Pool(workers, initializer=_child_init, initargs=(str(log_path), gpu_arch))
    try:
        pending = {s["id"]: pool.apply_async(compile_one, (s["source"], s["build_dir"])) for s in samples}
        while pending:
            for sample_id, job in list(pending.items()):
                if job.ready():
                    results[sample_id] = job.get()
                    del pending[sample_id]
                    if on_result:
                        on_result(sample_id, results[sample_id])
            if not pending or time.monotonic() >= deadline or (stop_early and stop_early()):
                break
            time.sleep(0.5)
        for sample_id in pending:
            results[sample_id] = {"built": None, "cut": True, "error": "pre-build stopped by the benchmark's budget",
                                  "compile_s": None}
    finally:
        pool.terminate()
        pool.join()
    in_order = {s["id"]: results[s["id"]] for s in samples}
    return {"samples": in_order, "wall_s": time.monotonic() - started, "workers": workers}


def evaluate_all(samples: list, settings: dict, gpu_arch: str, log_path: pathlib.Path, deadline: float) -> dict:
    """Samples evaluated one at a time, each in a fresh spawned process with a timeout, until the
    deadline. Returns per-sample outcomes (in order) and what was left out."""
    context = multiprocessing.get_context("spawn")
    outcomes, skipped = [], []
    for sample in samples:
        left = deadline - time.monotonic()
        if left < settings["min_eval_s"]:
            skipped.append(sample["id"])
            continue
        started = time.monotonic()
        with context.Pool(1, initializer=_child_init, initargs=(str(log_path), gpu_arch)) as pool:
            job = pool.apply_async(evaluate_one, (sample["ref_source"], sample["source"], sample["build_dir"], settings))
            try:
                outcome = job.get(timeout=min(settings["timeout_s"], left))
            except multiprocessing.TimeoutError:
                outcome = {"compiled": False, "correctness": False, "timeout": True, "error": "timed out"}
            pool.terminate()
        outcome.update(id=sample["id"], wall_s=time.monotonic() - started)
        outcome["class"] = verdict_class(outcome)
        outcomes.append(outcome)
    return {"outcomes": outcomes, "skipped": skipped}


def build_root() -> pathlib.Path:
    """A fresh folder for KernelBench's per-sample build dirs: its builds start cold, as kz's do."""
    return pathlib.Path(tempfile.mkdtemp(prefix="kb-builds-"))
