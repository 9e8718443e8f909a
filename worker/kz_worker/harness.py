"""One evaluation, stage by stage: load the reference, compile the candidate, check correctness
over several trials, time both on the GPU, and check correctness again after timing.

Every outcome is a verdict dict (never an exception): the status, the checks that fired, the
stage reached and a message. The C++ supervisor applies the stage deadlines.
"""
import pathlib

import torch

from . import compare, formats, loading, timing
from . import verdict as v


class Evaluation:
    def __init__(self, request: dict, channel):
        self.request = request
        self.channel = channel
        self.device = torch.device(request["device"])
        self.format = request["format"]
        self.seed = int(request["seed"])
        self.scratch = pathlib.Path(request["scratch_dir"])
        self.stage = "start"
        self.result = {"status": None, "correct": False, "compiled": False, "checks": [], "message": "",
                       "trials": int(request["trials"]), "trials_passed": 0, "timing": None}

    def enter(self, stage: str) -> None:
        self.stage = stage
        self.channel.stage(stage)

    def run(self) -> dict:
        try:
            self._run_stages()
        except v.Failure as failure:
            self._fail(failure.status, failure.message, failure.checks)
        except Exception as exc:  # the candidate's own exception: classify by stage and type
            status, check = formats.classify_exception(exc, self.stage)
            self._fail(status, v.describe_exception(exc), [check])
        self.result["stage"] = self.stage
        return self.result

    def _fail(self, status, message, checks):
        self.result.update(status=status, message=message, correct=False)
        self.result["checks"] += [c for c in checks if c not in self.result["checks"]]

    def _run_stages(self):
        self.enter("load_reference")
        on_cpu = self.device.type == "cpu"
        reference = loading.load_reference(self.request["reference_source"], self.scratch,
                                           use_cpu_sizes=on_cpu and self.request.get("use_cpu_sizes", True),
                                           overrides=self.request.get("size_overrides", {}))
        formats.prepare(self.format, self.device)

        self.enter("compile")
        model_class = formats.model_class_name(self.format, self.request["candidate_source"])
        candidate_class = loading.load_candidate(self.request["candidate_source"], self.scratch, model_class)
        init_inputs = reference.init_inputs()
        try:
            reference_model = reference.build(init_inputs, self.seed, self.device)
        except Exception as exc:
            raise v.Failure(v.INFRA_ERROR, "reference Model failed to build:\n" + v.describe_exception(exc),
                            [v.REFERENCE_FAILED])
        torch.manual_seed(self.seed)
        candidate_model = candidate_class(*loading.clone_all(init_inputs)).to(self.device).eval()
        self.result["weights_shared"] = loading.share_weights(reference_model, candidate_model)

        if not formats.runnable(self.format, self.device) or self.request.get("mode") == "compile":
            formats.finish_compile_only(self.format, candidate_model, reference, self.seed, self.device)
            self.result.update(status=v.COMPILED_NOT_RUN, compiled=True,
                               message=formats.compile_only_message(self.format, self.device))
            return
        if self.format not in ("triton", "torch"):
            self.result["compiled"] = True

        self.enter("correctness")
        with torch.no_grad():
            self._check_trials(reference, reference_model, candidate_model)
        self.result["compiled"] = True
        if self.device.type == "cuda" and self.request["timing"]["enabled"]:
            self.enter("timing")
            self._time(reference, reference_model, candidate_model)
            self.enter("recheck")
            with torch.no_grad():
                self._check_once(reference, reference_model, candidate_model, self.seed + 777_777,
                                 recheck=True)
        self.result.update(status=v.OK, correct=True,
                           message="correct" + (f", speedup {self.result['speedup']:.3f}x"
                                                if self.result.get("speedup") else ""))

    def _check_trials(self, reference, reference_model, candidate_model):
        errors = {"max_abs_error": 0.0, "max_rel_norm_error": 0.0}
        for trial in range(self.result["trials"]):
            stats = self._check_once(reference, reference_model, candidate_model, self.seed + 1000 * (trial + 1))
            for key in errors:
                errors[key] = max(errors[key], stats[key])
            self.result["trials_passed"] = trial + 1
        self.result.update(errors)

    def _check_once(self, reference, reference_model, candidate_model, seed, recheck=False):
        """One trial: candidate, reference, candidate again, on clones of one fresh input set."""
        inputs = reference.inputs(seed, self.device)
        originals = loading.clone_all(inputs)
        tolerances = self.request["tolerance"]
        try:
            formats.poison_free_memory(self.device, inputs)
            first_inputs = loading.clone_all(inputs)
            first = candidate_model(*first_inputs)
            formats.synchronize(self.device)
            # Triton compiles at the first launch: a forward that returned has compiled, even
            # when a check below fails (as for cuda/cuda-rtc, where compiled is set before).
            self.result["compiled"] = True
            compare.check_inputs_unchanged(first_inputs, originals)
            ref_inputs = loading.clone_all(inputs)
            ref_out = reference_model(*ref_inputs)
            stats = compare.compare_outputs(first, ref_out, tolerances)
            compare.check_aliasing(first, first_inputs, ref_out, ref_inputs)
            del first
            formats.poison_free_memory(self.device, inputs)
            second_inputs = loading.clone_all(inputs)
            second = candidate_model(*second_inputs)
            formats.synchronize(self.device)
            compare.check_inputs_unchanged(second_inputs, originals)
            compare.compare_outputs(second, ref_out, tolerances)
        except v.Failure as failure:
            if recheck:
                failure.checks.append(v.WRONG_AFTER_TIMING)
                failure.message = "after timing: " + failure.message
            raise
        return stats

    def _time(self, reference, reference_model, candidate_model):
        settings = self.request["timing"]
        input_sets = [reference.inputs(self.seed + 50_000 + k, self.device) for k in range(settings["input_sets"])]
        measured = timing.time_interleaved(reference_model, candidate_model, input_sets, settings, self.device)
        self.result["timing"] = measured
        self.result["runtime_ms"] = measured["candidate"]["median_ms"]
        self.result["ref_runtime_ms"] = measured["reference"]["median_ms"]
        self.result["speedup"] = measured["speedup"]
