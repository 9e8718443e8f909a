"""One evaluation, stage by stage: load the reference, compile the candidate, check correctness
over several trials, time both on the GPU, and check correctness again after timing.

Every outcome is a verdict dict (never an exception): the status, the checks that fired, the
stage reached and a message. The C++ supervisor applies the stage deadlines.

Everything the reference decides (the inputs of every trial, of the replay probe, of the timing
sets and of the recheck, and the reference outputs for all of them) is fixed before the candidate
module is imported, as fingerprints (Expected): a candidate that rebinds torch or the reference
cannot change it. The anti-cheating checks (cheats.py) watch the candidate from its import on.

On a GPU, the evaluation first reserves the memory it will need among the evaluations sharing the
GPU (gpu_memory), and holds one input set and one reference output at a time: input sets are
generated again from their seeds where they are used, reference outputs recomputed by the live
reference, each checked against its fingerprint.
"""
import contextlib
import copy
import os
import pathlib
import random
import time

import torch

from . import cheats, correctness, errors, fingerprint, gpu_lock, gpu_memory, loading, timing
from .compile import formats, load_inline
from . import verdict as v


def trial_key(trial: int) -> str:
    return f"trial{trial}"


PROBE = "probe"      # the second input set of the pointer-reuse probe
RECHECK = "recheck"  # after timing


def timing_key(k: int) -> str:
    return f"timing{k}"


class Expected:
    """What the reference decides, fixed before any candidate code runs: for every input set its seed,
    the digest of its inputs and the sketch of the reference's output (fingerprint.py). Nothing of a
    set stays on the device between uses, so an evaluation holds one input set and one reference
    output at a time, whatever the number of sets (gpu_memory): inputs are regenerated from their
    seed (and checked against their digest) where they are used, and reference outputs recomputed by
    the live reference (and checked against their sketch)."""

    def __init__(self, reference, model, device: torch.device, tolerances: dict):
        self.reference, self.model, self.device, self.tolerances = reference, model, device, tolerances
        self.sets = {}  # key -> (seed, digest of the inputs, sketch of the reference output)
        self._differ = {}
        # The float64 rule's reference (correctness.py), copied before any candidate code runs.
        self.model64 = _float64_copy(model) if tolerances.get("rule") == "float64" else None

    def add(self, key: str, seed: int) -> int:
        """Input set `key`'s fingerprints; returns the set's bytes."""
        inputs = self.reference.inputs(seed, self.device)
        digest = fingerprint.digest(inputs)
        out = self._run_reference(inputs)
        self.sets[key] = (seed, digest, fingerprint.Sketch(out))
        return gpu_memory.nbytes(inputs)

    def _run_reference(self, inputs):
        try:
            with torch.no_grad():
                out = self.model(*loading.clone_all(inputs))
            correctness.synchronize(self.device)
            return out
        except Exception as exc:
            if errors.is_memory_exception(exc):
                raise  # gpu_memory's to judge: the harness's, the task's or another evaluation's
            raise v.Failure(v.INFRA_ERROR, "reference Model failed to run:\n" + v.describe_exception(exc),
                            [v.REFERENCE_FAILED])

    def inputs(self, key: str):
        """Input set `key`, generated anew on the device: bit for bit the one the reference saw."""
        seed, digest, _ = self.sets[key]
        inputs = self.reference.inputs(seed, self.device)
        if fingerprint.digest(inputs) != digest:
            raise v.Failure(v.CHEAT_DETECTED,
                            f"input set {key}, generated again from its seed, differs from the one generated "
                            "before the candidate was imported: torch or the reference was tampered with",
                            [v.REFERENCE_TAMPERED])
        return inputs

    def check_unchanged(self, key: str, inputs) -> None:
        """The candidate left `inputs` (input set `key`'s) as they were generated."""
        fingerprint.check_unchanged(inputs, self.sets[key][1])

    def skeleton(self, key: str):
        """The reference output's structure, tensors as meta tensors (for the type checks)."""
        return self.sets[key][2].skeleton

    def output(self, key: str, inputs):
        """The live reference's output for `inputs` (input set `key`'s), which must still match what
        it gave before the candidate was imported."""
        live = self._run_reference(inputs)
        self.verify(key, live)
        return live

    def exact_output(self, inputs):
        """The reference run in float64 on `inputs` (the float64 rule's), or None: no such rule, or a
        reference that does not run in float64 (one that makes fp32 tensors of its own)."""
        if self.model64 is None:
            return None
        try:
            with torch.no_grad():
                return self.model64(*[x.double() if isinstance(x, torch.Tensor) and x.dtype == torch.float32 else x
                                      for x in inputs])
        except Exception:
            return None

    def verify(self, key: str, live) -> None:
        why = self.sets[key][2].mismatch(fingerprint.Sketch(live), self._tolerance)
        if why is not None:
            raise v.Failure(v.CHEAT_DETECTED,
                            f"the reference, run after the candidate was imported, no longer gives the output it "
                            f"gave before ({why}): torch or the reference was tampered with",
                            [v.REFERENCE_TAMPERED])

    def _tolerance(self, dtype):
        tol = correctness.tolerance_for(dtype, self.tolerances)
        return tol.atol, tol.rtol

    def differ(self, a: str, b: str) -> bool:
        """Whether the references of two input sets differ beyond tolerance (so that one output
        cannot be right for both)."""
        pair = tuple(sorted((a, b)))
        if pair not in self._differ:
            self._differ[pair] = self.sets[a][2].mismatch(self.sets[b][2], self._tolerance) is not None
        return self._differ[pair]


class Evaluation:
    def __init__(self, request: dict, channel):
        self.request = request
        self.channel = channel
        self.device = torch.device(request["device"])
        self.format = request["format"]
        self.policy = cheats.Policy.of(request)
        self.seed = int(request["seed"])
        self.scratch = pathlib.Path(request["scratch_dir"])
        self.stage = "start"
        self.result = {"status": None, "correct": False, "compiled": False, "checks": [], "message": "",
                       "trials": int(request["trials"]), "trials_passed": 0, "timing": None, "profile": {}}
        self.profile = self.result["profile"]  # where the seconds went (the verdict's profile): telemetry
        self.expected = None
        self.guard = None
        self.replays = None
        self.gpu = gpu_lock.NoLock()
        self.compile_started = None  # time.monotonic() at the compile stage's start
        self.profiled = False  # whether the audit forward runs under the profiler (cheats.profiles_audit)
        self._gpu_waited_noted = 0.0  # the lock's waited_s already given to a stage (_note_gpu_wait)
        self.memory = None  # the GPU memory slots held (gpu_memory.Reservation), on a GPU
        self.footprint = None  # the reference's memory (gpu_memory.Footprint), on a GPU
        self.memory_report = {}
        self.timing_sets = int(request.get("timing", {}).get("input_sets", 0))  # fewer for large inputs
        self.compiled_reference = None  # torch.compile of the reference, timed beside it ([timing] baseline)
        self.compile_baseline_error = None  # why there is none where one was asked for

    def enter(self, stage: str) -> None:
        self._note_gpu_wait()
        self.stage = stage
        self.channel.stage(stage)

    def _note_gpu_wait(self) -> None:
        """Adds the GPU-lock waits since the last call to the stage that had them (the verdict profile's
        gpu_wait_by_stage_s: which stage's seconds were waits, for the throughput report)."""
        waited = self.gpu.waited_s
        if waited > self._gpu_waited_noted:
            into = self.profile.setdefault("gpu_wait_by_stage_s", {})
            into[self.stage] = into.get(self.stage, 0.0) + waited - self._gpu_waited_noted
            self._gpu_waited_noted = waited

    def run(self) -> dict:
        try:
            self._run_stages()
        except v.Failure as failure:
            self._fail(failure.status, failure.message, failure.checks)
        except Exception as exc:  # the candidate's own exception: classify by stage and type
            if errors.is_memory_exception(exc) and self.device.type == "cuda":
                self._fail(*self._out_of_memory(exc))
            else:
                status, check = errors.classify_exception(exc, self.stage)
                self._fail(status, v.describe_exception(exc), [check])
        self.result["stage"] = self.stage
        self._note_gpu_wait()
        self.profile.update(self.gpu.report())
        try:  # diagnostics: never in the way of the verdict
            self._report_memory()
        except Exception:
            pass
        try:
            if build_s := load_inline.builds.build_parts(self.compile_started):
                self.profile["build_s"] = build_s
        except Exception:
            pass
        return self.result

    def _fail(self, status, message, checks):
        # A failed verdict carries no speed: the recheck can fail after _time recorded one.
        self.result.update(status=status, message=message, correct=False, timing=None)
        for key in ("runtime_ms", "ref_runtime_ms", "speedup", "compile_speedup"):
            self.result.pop(key, None)
        self.result["checks"] += [c for c in checks if c not in self.result["checks"]]

    def _run_stages(self):
        self.enter("load_reference")
        on_cpu = self.device.type == "cpu"
        # Where the stage's time goes (lock waits included): the reference's import, its Model built
        # and moved to the device, every input set and reference output, the audit's warm-up.
        loaded = self.profile["load_reference_s"] = {}
        with _seconds(loaded, "import"):
            reference = loading.load_reference(self.request["reference_source"], self.scratch,
                                               use_cpu_sizes=on_cpu and self.request.get("use_cpu_sizes", True),
                                               overrides=self.request.get("size_overrides", {}))
            formats.prepare(self.format, self.device, self.request.get("extensions"),
                            mute_extensions=cheats.probes_kernel_effect(self.format, self.policy))
            init_inputs = reference.init_inputs()
        # A compile-only request (a pre-build) builds the candidate and no more: the evaluation that
        # follows builds the reference (and reports it if it fails).
        pre_build = self.request.get("mode") == "compile"
        runs = formats.runnable(self.format, self.device) and not pre_build
        timed = runs and self.device.type == "cuda" and self.request["timing"]["enabled"]
        if runs and self.device.type == "cuda" and self.request.get("gpu_memory_dir"):
            with _seconds(loaded, "memory"):  # the estimate, and the wait for the memory
                self._reserve_memory(reference, init_inputs)
        try:
            with _seconds(loaded, "build"):
                reference_model = None if pre_build else reference.build(init_inputs, self.seed, self.device)
        except Exception as exc:
            if errors.is_memory_exception(exc):
                raise
            raise v.Failure(v.INFRA_ERROR, "reference Model failed to build:\n" + v.describe_exception(exc),
                            [v.REFERENCE_FAILED])
        try:
            self.gpu = gpu_lock.for_request(self.request, self.device)
        except gpu_lock.LockFileMissing as exc:  # no lock is no timing to trust: the machine's fault
            raise v.Failure(v.INFRA_ERROR, str(exc))
        if runs:
            with _seconds(loaded, "inputs"):
                self._precompute(reference, reference_model, timed)
        if timed and self.request["timing"].get("baseline") == "compile":
            with _seconds(loaded, "compile_baseline"):
                self._compile_reference(reference_model)
        self.profiled = cheats.profiles_audit(self.format, self.device, self.request.get("kernel_share", "cuda"),
                                              self.policy)
        with _seconds(loaded, "warm_up"):
            cheats.install_launch_hooks(self.format)
            if runs and cheats.POLICY.get(self.format) is not None:
                # Imports and, where the audit is profiled, the profiler's start-up (seconds of CPU, one
                # tiny kernel): outside the GPU lock, where a waiting timing would otherwise queue every
                # worker behind it.
                cheats.warm_up(self.device, profiler=self.profiled)
            self.guard = cheats.Guard(self.format)  # the identity snapshot: nothing of the candidate's ran yet

        self.enter("compile")
        self.compile_started = time.monotonic()
        # Where the stage's time goes (lock waits included): the candidate's import, its ModelNew
        # built, moved to the device with the reference's weights; nvrtc: kz_rtc's compiles, inside
        # the first two.
        compiled = self.profile["compile_s"] = {}
        nvrtc_before = formats.nvrtc_seconds(self.format)
        try:
            candidate_model = self._compile_candidate(compiled, init_inputs, reference_model)
        finally:  # NVRTC's seconds too where it failed (a compile_error)
            formats.note_nvrtc_seconds(self.format, nvrtc_before, compiled)

        if not runs:
            formats.finish_compile_only(self.format, candidate_model, reference, self.seed, self.device)
            self.guard.verify("compiling ModelNew")
            self.result.update(status=v.COMPILED_NOT_RUN, compiled=True,
                               message=formats.compile_only_message(self.format, self.device))
            return
        if self.format not in ("triton", "torch"):
            self.result["compiled"] = True

        self.enter("correctness")
        self.replays = cheats.ReplayDetector(self.expected.differ)
        # The GPU lock is taken per unit of work (the audit, each trial, the probe), so a waiting
        # timing gets the GPU between them instead of after all of them.
        parts = self.profile["correctness_s"] = {}  # where the stage's time goes (lock waits included)
        with torch.no_grad():
            if cheats.POLICY.get(self.format) is not None:
                with _seconds(parts, "audit"):
                    self._audit(candidate_model)
            with _seconds(parts, "trials"):
                self._check_trials(candidate_model)
            with _seconds(parts, "replay_probe"), self.gpu.shared():
                self._replay_probe(candidate_model)
        self.result["compiled"] = True
        if timed:
            self.enter("timing")  # the stage deadline covers the waits for the GPU too
            self._time(reference_model, candidate_model)
            self.enter("recheck")
            with torch.no_grad(), self.gpu.shared():
                self._check_once(candidate_model, RECHECK, recheck=True)
        self.result.update(status=v.OK, correct=True,
                           message="correct" + (f", speedup {self.result['speedup']:.3f}x"
                                                if self.result.get("speedup") else "")
                           + (f", {self.result['compile_speedup']:.3f}x over torch.compile"
                              if self.result.get("compile_speedup") else "")
                           + (f" (no torch.compile baseline: {self.compile_baseline_error})"
                              if self.compile_baseline_error else ""))

    # ---- before the candidate --------------------------------------------------------------------

    def _compile_candidate(self, compiled: dict, init_inputs, reference_model):
        """The candidate's import, its ModelNew built and moved to the device with the reference's
        weights; each part's seconds into `compiled` (lock waits included)."""
        model_class = formats.model_class_name(self.format, self.request["candidate_source"])
        with _seconds(compiled, "import"):
            candidate_class = loading.load_candidate(self.request["candidate_source"], self.scratch, model_class)
            self.guard.verify("importing the candidate")
        # The constructor is not held, like the import above: it may compile (kz_rtc.compile, a
        # load_inline build), seconds of CPU that would keep a waiting timing, and every worker
        # queued behind it, off the GPU. Moving the model to the device and the weight copy are the
        # harness's GPU work: shared, never beside another worker's timing.
        with _seconds(compiled, "construct"):
            torch.random.manual_seed(self.seed)
            candidate_model = candidate_class(*loading.clone_all(init_inputs))
            self.guard.verify("constructing ModelNew")
        with _seconds(compiled, "to_device"), self.gpu.shared():
            candidate_model = candidate_model.to(self.device).eval()
            if reference_model is not None:
                self.result["weights_shared"] = loading.share_weights(reference_model, candidate_model)
                self.guard.verify("copying the reference weights")
        return candidate_model

    def _precompute(self, reference, reference_model, timed: bool) -> None:
        """Every input set's digest and reference sketch (Expected), the first set measuring the
        reference where the meta estimate could not (gpu_memory)."""
        self.expected = Expected(reference, reference_model, self.device, self.request["tolerance"])
        first = [(trial_key(0), self.seed + 1000)]
        with self.gpu.shared():
            if self.memory is not None and self.footprint is None:
                self._measure_reference(reference, first[0])
            else:
                self.expected.add(*first[0])
        sets = [(trial_key(trial), self.seed + 1000 * (trial + 1)) for trial in range(1, self.result["trials"])]
        sets.append((PROBE, self.seed + 880_000))
        if timed:
            settings = self.request["timing"]
            sets += [(timing_key(k), self.seed + 50_000 + k) for k in range(self.timing_sets)]
            sets.append((RECHECK, self.seed + 777_777))
            # Drawn before any candidate code runs, from the OS rather than the request's seed: which
            # timed runs get checked is nothing the candidate can compute or influence.
            rng = random.Random(os.urandom(16))
            self.sampled_runs = timing.sample_runs(settings["runs"], self.timing_sets, rng)
            self.guarded_runs = timing.guard_runs(settings["runs"], rng)
        for key, seed in sets:
            with self.gpu.shared():  # per input set: a waiting timing gets the GPU in between
                self.expected.add(key, seed)

    def _compile_reference(self, reference_model) -> None:
        """torch.compile of the reference ([timing] baseline = "compile"), compiled now, on the first
        trial's inputs: before any candidate code runs (Inductor's imports and code are in the identity
        snapshot, none of the candidate's making), and outside the timing. A reference Inductor cannot
        compile leaves the evaluation without the baseline, saying why, not without a verdict."""
        try:
            compiled = torch.compile(reference_model)
            with self.gpu.shared(), torch.no_grad():
                compiled(*self.expected.inputs(trial_key(0)))
                correctness.synchronize(self.device)
            self.compiled_reference = compiled
        except Exception as exc:
            if errors.is_memory_exception(exc):
                raise
            text = str(exc).strip()
            self.compile_baseline_error = f"{type(exc).__name__}: {text.splitlines()[0][:200]}" if text else type(exc).__name__

    # ---- GPU memory ------------------------------------------------------------------------------

    def _reserve_memory(self, reference, init_inputs) -> None:
        """Before anything of the task is on the device: its need (the meta estimate), then that many
        of the GPU's memory slots, waiting (stage await_memory) while other evaluations hold them.
        Where the estimate fails, every slot: _measure_reference then gives back the surplus."""
        card = torch.cuda.get_device_properties(self.device).total_memory
        fraction = torch.cuda.get_per_process_memory_fraction(self.device) or 1.0
        capacity = gpu_memory.capacity_bytes(card, fraction, int(self.request.get("gpu_memory_processes", 1)))
        self.memory_report.update(card_mb=card / 2**20, capacity_mb=capacity / 2**20)
        try:
            self.footprint = gpu_memory.estimate_on_meta(reference, init_inputs, self.seed)
        except Exception:
            self.footprint = None  # measured on the device, alone (_measure_reference)
        need = 0 if self.footprint is None else self._budget(capacity)
        self.memory = gpu_memory.Reservation(self.request["gpu_memory_dir"], gpu_lock.gpu_stem(self.device), capacity)
        stage = self.stage

        def waiting():
            if self.stage != "await_memory":
                self.enter("await_memory")

        alone = bool(self.request.get("gpu_alone")) or self.footprint is None
        self.memory.reserve(need, alone, on_wait=waiting)
        if need:  # the slots promise it; the card may still lack it (gpu_memory.await_device_memory)
            wait_s = float(self.request.get("device_memory_wait_s", gpu_memory.DEVICE_WAIT_S))
            waited, _ = gpu_memory.await_device_memory(self.device, need, wait_s, on_wait=waiting)
            self.memory.waited_s += waited
        if self.stage != stage:
            self.enter(stage)

    def _budget(self, capacity: int) -> int:
        """The budget of self.footprint, the timing's buffers cut to fit (gpu_memory); exceeds_gpu_memory
        where the capacity cannot give it."""
        self.timing_sets = gpu_memory.timing_sets(self.timing_sets, self.footprint.inputs)
        need = gpu_memory.budget_bytes(self.footprint, self.timing_sets)
        if need > capacity:
            card = torch.cuda.get_device_properties(self.device).total_memory
            raise gpu_memory.exceeds_failure(need, capacity, card, self.footprint)
        return need

    def _measure_reference(self, reference, first_set) -> None:
        """The first input set and its reference output, measured on the device with every slot held:
        the footprint the meta estimate could not give; the slots beyond its budget go back."""
        weights = torch.cuda.memory_allocated(self.device)  # the reference Model, just built
        gpu_memory.reset_peak(self.device)
        inputs = self.expected.add(*first_set)
        peak = torch.cuda.max_memory_allocated(self.device) - weights
        # The set and its clone for the reference were alive at the peak, beside the forward's tensors.
        self.footprint = gpu_memory.Footprint(weights=weights, inputs=inputs,
                                              forward_peak=max(0, peak - 2 * inputs), estimate="measured")
        need = self._budget(self.memory.capacity)
        if not self.request.get("gpu_alone"):
            self.memory.shrink_to(need)

    def _out_of_memory(self, exc):
        """(status, message, checks) for a CUDA out-of-memory error: another evaluation's doing where
        others held memory on the GPU (infra_error, retried alone by the supervisor); with the GPU to
        itself and before the candidate ran, the machine's where the card lacked what the slots promise
        (memory held outside the evaluations), else the task's (the harness or the reference ran out);
        once the candidate ran, the candidate's."""
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if self.memory is not None and not self.memory.alone:
            return (v.INFRA_ERROR, f"out of GPU memory in stage {self.stage} while other evaluations held memory on "
                                   f"this GPU ({text}); to be run again with the GPU to itself",
                    [v.OUT_OF_MEMORY_SHARED])
        before_candidate = self.stage in ("start", "load_reference", "await_memory")
        missing = self._memory_held_elsewhere(text) if before_candidate else ""
        if missing:
            return (v.INFRA_ERROR, f"out of GPU memory in stage {self.stage} ({text}), with every slot held: "
                                   + missing, [v.GPU_MEMORY_HELD_ELSEWHERE])
        if before_candidate:
            return (v.INFRA_ERROR, f"the reference and the harness ran out of GPU memory with the GPU to themselves "
                                   f"({text})", [v.EXCEEDS_GPU_MEMORY])
        return (v.RUNTIME_ERROR, f"out of memory in stage {self.stage}"
                                 f"{' with the GPU to itself' if self.memory is not None else ''}:\n"
                                 + v.describe_exception(exc), [v.MEMORY_LIMIT])

    def _memory_held_elsewhere(self, text: str) -> str:
        """After an out-of-memory with every slot held, before any candidate code ran (so nothing of
        the candidate's can hold memory outside PyTorch's allocator): what the card lacked of what
        the slots promise, where the reference and the harness stayed within the promise
        (gpu_memory.held_elsewhere); "" otherwise, or when the memory cannot be read."""
        if self.memory is None:
            return ""
        try:
            free, own = gpu_memory.device_memory(self.device)
        except Exception:  # a device past reading: the usual verdict
            return ""
        promised = self.memory.reserved_bytes
        missing = gpu_memory.held_elsewhere(promised, free, own, gpu_memory.requested_bytes(text))
        if not missing:
            return ""
        return (f"{missing / 2**20:,.0f} MiB of the {promised / 2**20:,.0f} MiB its slots promise were held outside "
                f"this evaluation ({free / 2**20:,.0f} MiB free): another process on the GPU, or one still freeing "
                f"its memory; not the task's")

    def _report_memory(self) -> None:
        """The verdict's `memory`: the estimate, the reservation and the measured peak (diagnostics)."""
        report = self.memory_report
        if self.footprint is not None:
            report.update(reference_peak_mb=self.footprint.reference_peak / 2**20, estimate=self.footprint.estimate)
        if self.memory is not None:
            report.update(budget_mb=self.memory.reserved_bytes / 2**20, slots=self.memory.slots,
                          slot_mb=self.memory.slot_bytes / 2**20, wait_s=self.memory.waited_s, alone=self.memory.alone)
        if self.device.type == "cuda" and torch.cuda.is_initialized():
            report["peak_mb"] = torch.cuda.max_memory_allocated(self.device) / 2**20
        if report:
            self.result["memory"] = report

    # ---- candidate runs and their checks ---------------------------------------------------------

    def _forward(self, model, inputs, where: str):
        out = model(*inputs)
        self.guard.verify(f"after {where}")
        correctness.synchronize(self.device)
        # Triton compiles at the first launch: a forward that returned has compiled, even
        # when a check below fails (as for cuda/cuda-rtc, where compiled is set before).
        self.result["compiled"] = True
        return out

    def _reference_output(self, key, inputs):
        """The live reference for the candidate's `inputs` (input set `key`), once they are checked
        unchanged: it must still give what it gave before the candidate was imported."""
        self.expected.check_unchanged(key, inputs)
        return self.expected.output(key, inputs)

    def _check_output(self, out, key, inputs, live) -> dict:
        """Every check of one candidate output for input set `key` (its inputs: `inputs`, checked
        unchanged before), against `live`, the live reference's output for them."""
        with self.guard.comparing("comparing outputs"):
            cheats.check_output_types(out, live)
            cheats.check_aliases_reference(out, [live])
            self.replays.check(key, out)
            stats = correctness.compare_outputs(out, live, self.request["tolerance"], self.expected.exact_output(inputs))
            correctness.check_aliasing(out, inputs, live, inputs)
        return stats

    def _audit(self, candidate_model) -> None:
        """One extra forward (the first): ATen ops traced, kernel launches counted, kernels profiled
        on a GPU. Its output is checked like a trial's."""
        key = trial_key(0)
        with self.gpu.shared():
            inputs = self.expected.inputs(key)
            correctness.poison_free_memory(self.device, inputs)
        # Holds the GPU for the forward only, not for the profiler's own CPU work.
        out, report = cheats.audit_forward(self.format, candidate_model, inputs, self.device, self.gpu.shared,
                                           profiled=self.profiled)
        self.guard.verify("after the traced forward")
        self.result["compiled"] = True
        if report.custom_share is not None:
            self.result["custom_kernel_share"] = report.custom_share
        missing = cheats.unchecked(self.format, report, self.policy)
        if missing:
            self.result["unchecked"] = missing
        failure = cheats.audit_failure(self.format, report, self.policy)
        if failure is not None:
            raise failure
        probing = cheats.probes_kernel_effect(self.format, self.policy)
        with self.gpu.shared():
            correctness.synchronize(self.device)
            with self.guard.comparing("checking the inputs"):
                live = self._reference_output(key, inputs)
            self._check_output(out, key, inputs, live)
            # Overwritten before it is freed: on the CPU (no poisoned free memory) the effect probe's
            # muted forward could otherwise be handed its block, the right values, as its output.
            cheats.poison(cheats.leaves(live))
            expected = self._kept_for_the_effect_probe(out, candidate_model) if probing else None
            del out, live
            cheats.poison(inputs)
        if expected is not None:
            self._probe_kernel_effect(candidate_model, key, expected)

    def _kept_for_the_effect_probe(self, out, candidate_model):
        """A copy of the audit's output, the output itself overwritten (NaN): an output buffer the
        candidate reuses then holds nothing right for the muted forward to return."""
        with self.guard.comparing("keeping the audit's output"):
            expected = cheats.clone_output(out)
            cheats.poison(cheats.leaves(out), keep=[*candidate_model.parameters(), *candidate_model.buffers()])
        return expected

    def _probe_kernel_effect(self, candidate_model, key, expected) -> None:
        """The audit's forward again, on its input set, with the candidate's own launches muted: an
        output that still matches the audit's (`expected`) means their work never reached it
        (no_kernel_effect)."""
        with self.gpu.shared():
            inputs = self.expected.inputs(key)
            correctness.poison_free_memory(self.device, inputs)
            muted, muted_calls = self._muted_forward(candidate_model, inputs)
            if unprobed := cheats.unprobed(self.format, muted_calls):
                self.result.setdefault("unchecked", {}).update(unprobed)
                failure = None
            else:
                with self.guard.comparing("comparing the forward with muted kernels"):
                    failure = cheats.kernel_effect_failure(muted, expected, self.request["tolerance"])
            del muted, expected
            cheats.poison(inputs)
        if failure is not None:
            raise failure

    def _muted_forward(self, candidate_model, inputs):
        """(the candidate's forward with its launches muted, how many were muted); the output None where
        it raised: it could not go on without its kernels' work, which so reached it (running out of
        memory is no such sign)."""
        try:
            with cheats.muted_launches() as muted:
                out = candidate_model(*inputs)
            correctness.synchronize(self.device)
        except Exception as exc:
            if errors.is_memory_exception(exc):
                raise
            out = None
        self.guard.verify("after the forward with muted kernels")
        return out, muted["calls"]

    def _check_trials(self, candidate_model):
        errors = {"max_abs_error": 0.0, "max_rel_norm_error": 0.0}
        for trial in range(self.result["trials"]):
            with self.gpu.shared():
                stats = self._check_once(candidate_model, trial_key(trial))
            for key in errors:
                errors[key] = max(errors[key], stats[key])
            self.result["trials_passed"] = trial + 1
        self.result.update(errors)

    def _check_once(self, candidate_model, key, recheck=False):
        """One trial: the candidate, the live reference, the candidate again, on one input set."""
        try:
            inputs = self.expected.inputs(key)
            correctness.poison_free_memory(self.device, inputs)
            first = self._forward(candidate_model, inputs, "a correctness trial")
            with self.guard.comparing("checking the inputs"):
                live = self._reference_output(key, inputs)
            stats = self._check_output(first, key, inputs, live)
            del first
            # Run again into fresh, poisoned memory, with the reference's output alive: an output
            # fished out of freed memory is caught.
            correctness.poison_free_memory(self.device, inputs)
            second = self._forward(candidate_model, inputs, "a correctness trial")
            with self.guard.comparing("checking the inputs"):
                self.expected.check_unchanged(key, inputs)
            self._check_output(second, key, inputs, live)
            del second, live
            # The harness's own tensors are overwritten before they are freed (on the CPU too, where
            # free memory is not poisoned): whatever reuses their memory holds nothing correct.
            cheats.poison(inputs)
        except v.Failure as failure:
            if recheck:
                failure.checks.append(v.WRONG_AFTER_TIMING)
                failure.message = "after timing: " + failure.message
            raise
        return stats

    def _replay_probe(self, candidate_model) -> None:
        """The same input buffers with new data: a candidate that caches by pointer (or by shape)
        returns the old result."""
        first, second = trial_key(0), PROBE
        buffers = self.expected.inputs(first)
        out = self._forward(candidate_model, buffers, "the pointer-reuse probe")
        live = self._reference_output(first, buffers)
        self._check_output(out, first, buffers, live)
        del out, live
        _refill(buffers, self.expected.inputs(second))
        again = self._forward(candidate_model, buffers, "the pointer-reuse probe")
        live = self._reference_output(second, buffers)
        self._check_output(again, second, buffers, live)
        del again, live
        cheats.poison(buffers)

    # ---- timing ----------------------------------------------------------------------------------

    def _time(self, reference_model, candidate_model):
        """The timed runs, alone on the GPU (exclusive hold); then, sharing it, the comparisons of the
        sampled outputs that the hold only copied; the speedup is recorded only once they passed."""
        with self.gpu.shared():
            snapshots = timing.Snapshots(self.device, self.memory)
            key = timing_key(0)
            inputs = self.expected.inputs(key)
            snapshots.reserve(len(self.sampled_runs), self.expected.skeleton(key), inputs)
            del inputs
        with self.gpu.exclusive():
            measured = self._timed_runs(reference_model, candidate_model, snapshots)
        # Its own field: timing_s is the exclusive hold, and these seconds are not in it.
        with self.gpu.shared(), _seconds(self.profile.setdefault("timing_after_hold_s", {}), "checks"):
            self._check_snapshots(snapshots)
        # How the samples were taken is the profile's; what they measured is the verdict's.
        self.profile["timing_end"] = measured.pop("end")
        self.profile.update({key: measured.pop(key) for key in ("reference_gap_ms", "candidate_gap_ms", "launch_spin")})
        self.result["timing"] = measured
        self.result["runtime_ms"] = measured["candidate"]["median_ms"]
        self.result["ref_runtime_ms"] = measured["reference"]["median_ms"]
        self.result["speedup"] = measured["speedup"]
        if "compile_speedup" in measured:
            self.result["compile_speedup"] = measured["compile_speedup"]

    def _timed_runs(self, reference_model, candidate_model, snapshots):
        """Inside the exclusive hold: the interleaved runs and the checks that must see each candidate
        run's live objects, whose copies go into `snapshots`. Returns the measurement."""
        settings = self.request["timing"]
        n = self.timing_sets
        keys = [timing_key(k) for k in range(n)]
        # Where the exclusive hold goes: inputs, warmup, timed; new_round, guard (its check after each
        # candidate run) and samples (the sampled outputs' live checks and copies) are parts of the last two.
        parts = self.profile["timing_s"] = {}
        with _seconds(parts, "inputs"):
            buffers = [self.expected.inputs(key) for key in keys]
        holds = list(range(n))  # buffers[k] holds the data of input set holds[k]

        def new_round(r):
            # Each round moves every input set to another buffer: a result cached by pointer is
            # stale, and a sampled check below catches it.
            with _seconds(parts, "new_round"):
                for k in range(n):
                    holds[k] = (k + r) % n
                    _refill(buffers[k], self.expected.inputs(keys[holds[k]]))

        sampled, guarded = self.sampled_runs, self.guarded_runs

        def after_candidate(k, out, run):
            if run is None or run in guarded or run in sampled:
                with _seconds(parts, "guard"):
                    self.guard.verify("after a timed forward", in_hold=True)
            if run in sampled:
                with _seconds(parts, "samples"):
                    self._check_timed(out, keys[holds[k]], buffers[k], run, snapshots)

        measured = timing.time_interleaved(reference_model, candidate_model, buffers, settings, self.device,
                                           after_candidate=after_candidate,
                                           new_round=new_round if n > 1 else None, seconds=parts,
                                           compiled=self.compiled_reference)
        return measured

    def _check_timed(self, out, key, inputs, run, snapshots) -> None:
        """A sampled run, in the hold: what must see the live output (its exact type before any of its
        methods runs, its structure before clone_output walks it, its storage), then a copy of it and
        of its inputs for _check_snapshots, or the comparison now where the copy does not fit."""
        with _timed_run(run), self.guard.comparing("checking a timed output", in_hold=True):
            expected = self.expected.skeleton(key)
            cheats.check_output_types(out, expected)
            correctness.check_structure(out, expected)
            if not snapshots.take(run, key, out, inputs):
                self._compare_timed(key, out, inputs)

    def _check_snapshots(self, snapshots) -> None:
        """After the hold, in run order: the comparisons _check_timed left for later."""
        try:
            with self.guard.comparing("checking the timed outputs"):
                for run, key, out, inputs in snapshots.runs:
                    with _timed_run(run):
                        self._compare_timed(key, out, inputs)
        finally:
            snapshots.runs.clear()  # their memory, before the recheck needs it

    def _compare_timed(self, key, out, inputs) -> None:
        self.expected.check_unchanged(key, inputs)
        live = self.expected.output(key, inputs)
        cheats.check_aliases_reference(out, [live])
        correctness.compare_outputs(out, live, self.request["tolerance"], self.expected.exact_output(inputs))


def _float64_copy(model):
    """The reference Model in float64 (its floating-point parameters and buffers), or None where it
    cannot be copied."""
    try:
        return copy.deepcopy(model).double()
    except Exception:
        return None


def _refill(buffers, inputs) -> None:
    """Copies input set `inputs` into the tensors of `buffers`. A function of its own so that the
    generated set is freed when it returns: a loop variable left holding its last tensor kept a
    second copy of a large input alive while the next set was generated (gpu_memory.budget_bytes
    counts one set beyond the buffers)."""
    for buffer, data in zip(buffers, inputs):
        if isinstance(buffer, torch.Tensor):
            buffer.copy_(data)


@contextlib.contextmanager
def _timed_run(run: int):
    """A timed run's failed check is a cheat: the same candidate passed the correctness trials."""
    try:
        yield
    except v.Failure as failure:
        raise v.Failure(v.CHEAT_DETECTED, f"timed run {run}: {failure.message}",
                        failure.checks + [v.WRONG_DURING_TIMING])


# Any values: the warm-up compares a tensor with its copy, which passes every tolerance.
_WARM_UP_TOLERANCE = {"atol_fp32": 1e-4, "rtol_fp32": 1e-4, "norm_tol_fp32": 1e-3,
                      "atol_half": 1e-2, "rtol_half": 1e-2, "norm_tol_half": 2e-2}


def load_check_kernels(device: torch.device) -> None:
    """Runs the harness's checks once on a small float32 tensor of the device (a worker preparing its
    device): CUDA loads each kernel at its first launch (lazy loading), and the checks' ~20 (input
    sets' randn, the comparisons in float64 with their masks, norms and reductions, the
    fingerprints' sums and hashes, the poison's fill) otherwise load in the first evaluation's audit,
    inside a shared GPU hold that a waiting timing, and every worker queued behind it, waits out.
    Other dtypes load theirs where a request uses them. (On the CPU it loads nothing: tests run it.)"""
    with torch.device(device):
        reference = torch.randn(256)
    out = reference.clone()
    correctness.compare_outputs(out, reference, _WARM_UP_TOLERANCE)
    fingerprint.check_unchanged([out], fingerprint.digest([reference]))
    fingerprint.Sketch(out).mismatch(fingerprint.Sketch(reference), lambda dtype: (1e-4, 1e-4))
    correctness.poison_free_memory(device, [reference])
    cheats.poison([out, reference])
    correctness.synchronize(device)


@contextlib.contextmanager
def _seconds(into: dict, part: str):
    """Adds the seconds the block took to into[part], however it ends."""
    start = time.perf_counter()
    try:
        yield
    finally:
        into[part] = into.get(part, 0.0) + time.perf_counter() - start
