"""kz's libtorch engine against Hugging Face transformers on one random-init checkpoint (issue #5,
"Speed"): prefill and greedy-decode tokens/s, training-step tokens/s (LoRA and full fine-tuning),
peak CUDA memory per phase, and batch-1 decode as a fraction of the memory-bandwidth limit.

    python3 bench/model_bench.py --kz-bin build/model/kz_model_bench --out OUTDIR          # H200
    python3 bench/model_bench.py --kz-bin build/model/kz_model_bench --out OUTDIR --tiny   # CPU test
    python3 bench/model_bench.py ... --train lora --train-batch 8 --train-len 2048         # training variants
    python3 bench/model_bench.py ... --train full --train-full-preset qwen2.5-7b           # full FT of the 7B
    python3 bench/model_bench.py ... --rollout                                             # GRPO rollout too

Steps: measure copy bandwidth; build a random-init Qwen2.5-7B-shaped model in bf16 with
transformers directly on the device and save it (a temporary checkpoint, removed at the end);
run kz_model_bench on that checkpoint in a subprocess (again without CUDA graphs if it crashes);
benchmark the transformers model already in memory; print a table. Both frameworks: prompts of
random ids, greedy (or --temperature T: sampled over the whole vocabulary), eos ignored
(min_new_tokens = max_new_tokens), the same new-token count.

Decode tokens/s counts only decode steps: kz times its decode loop directly; transformers
(generate has no hook between prefill and decode) as batch x (N - 1) / (t(N new) - t(1 new)).
The batch-1 bandwidth limit is copy bandwidth (bytes read + written by a large device copy) over
the weight bytes one decode step reads (every weight except the input embedding table, of which
a step reads one row; the KV cache is ignored, < 1% at batch 1).

Rollout (--rollout, after decode): the rollout of a GRPO step, rollout-prompts random prompts of
rollout-prompt tokens x rollout-samples samples (default 64 x 8 x 512) at rollout-temperature
(default 1, whole vocabulary), each request stopping at its own max_new_tokens, drawn by
kz_model_bench uniformly from [rollout-new / 8, rollout-new] (default 1024): random weights never
stop on their own, so the limits give the lengths a real rollout gets from its stops. Both sides
get the same prompts and limits (kz's "rollout_work"); tokens/s = the requests' own new tokens /
wall time of the whole rollout (prefill included), after an untimed warm-up. kz: one generate()
call (continuous batching, at most --rollout-max-rows rows, 0 = all). transformers: generate() in
batches of --hf-rollout-batch consecutive sequences (default 256, 32 groups, which fits an 80 GB
card beside the kz run and keeps transformers' host-bound steps to two batches; 0 = all at once),
each batch run to its longest row's limit because one call has one max_new_tokens: the extra
tokens cost time but are not counted, which is what generate costs on this work.

Training (--train lora,full), after the inference phases, on the same model on both sides: one
batch of train-batch x train-len random ids (default 4 x 1024), token-mean causal-LM cross-entropy,
AdamW (lr 1e-5, no weight decay) after clipping the gradient norm to 1, one warm-up step then
train-steps timed steps (default 5) between device synchronisations: tokens/s = batch x len x
steps / time. Activation checkpointing of every decoder layer on both sides (kz's
activation_checkpointing, transformers' gradient_checkpointing_enable, non-reentrant) unless
--no-train-checkpointing. kz trains with its Trainer (train.h); transformers with torch.optim.AdamW
(fused on CUDA, transformers' default optimiser) and torch.nn.utils.clip_grad_norm_.
  lora: adapters r 16, alpha 32, no dropout, on q,k,v,o,gate,up,down_proj, float32 over the bf16
        base (kz: lora.h; transformers: peft, removed again afterwards).
  full: every parameter. kz keeps float32 master weights, gradients and moments for its bf16
        weights (train.h), ~18 bytes per parameter, or with --no-train-masters bf16 ones rounded
        stochastically, ~8; torch.optim.AdamW updates the bf16 weights with bf16 moments, ~8.
        With masters the 7B's would need ~128 GiB of kz state before activations, with
        the transformers model resident beside it, so by default full fine-tuning runs on a second
        checkpoint, --train-full-preset (Qwen2.5-0.5B's architecture, random weights), built and
        run the same way once the first is done. Naming the main preset (qwen2.5-7b) trains it in
        the main run instead; running out of memory is then reported in the phase's "error".

Outputs in OUTDIR: model_bench.json (everything), kz.json and kz.err (the tool's output),
kz_full.json and kz_full.err (its run on the full-fine-tuning preset), table.txt (what is
printed last).
"""
import argparse
import contextlib
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch

PRESETS = {
    # Qwen2.5-7B's architecture (config.json of Qwen/Qwen2.5-7B), random weights.
    "qwen2.5-7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768,
                       rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                       use_sliding_window=False),
    # Qwen2.5-0.5B's architecture (config.json of Qwen/Qwen2.5-0.5B), random weights: full
    # fine-tuning where the 7B's does not fit.
    "qwen2.5-0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                         rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                         use_sliding_window=False),
    # The same family at toy size, for the CPU test of every code path.
    "tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                 rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False, use_sliding_window=False),
    # Toy size with tied embeddings like Qwen2.5-0.5B: the CPU test's second (full fine-tuning) checkpoint.
    "tiny-tied": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False),
}

TRAIN_MODES = ("lora", "full")
# The training recipe of both sides (kz_model_bench hard-codes the same: bench_lora, TrainOptions).
LORA_RANK, LORA_ALPHA = 16, 32
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LEARNING_RATE, MAX_GRAD_NORM = 1e-5, 1.0


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kz-bin", required=True, help="path to kz_model_bench")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--tiny", action="store_true", help="toy model on the CPU with small shapes (the CTest)")
    p.add_argument("--device", help="default cuda:0, or cpu with --tiny")
    p.add_argument("--batches", default=None, help="decode batch sizes (default 1,16,64; tiny 1,2)")
    p.add_argument("--prompt", type=int, default=None, help="decode prompt tokens (default 512)")
    p.add_argument("--new", type=int, default=None, help="new tokens per row (default 256)")
    p.add_argument("--prefill-batch", type=int, default=None, help="default 8")
    p.add_argument("--prefill-len", type=int, default=None, help="default 2048")
    p.add_argument("--hf-cache", default="dynamic", choices=["dynamic", "static"],
                   help="transformers' KV cache in generate (static only pays off with torch.compile)")
    p.add_argument("--skip-hf", action="store_true", help="only kz")
    p.add_argument("--no-graph", action="store_true", help="kz decodes eagerly")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="decode sampled at this temperature over the whole vocabulary (no top-k or top-p), "
                        "both frameworks; 0 (the default): greedy")
    p.add_argument("--rollout", action="store_true", help="also the rollout phase (GRPO-shaped generation)")
    p.add_argument("--rollout-prompts", type=int, default=None, help="distinct prompts (default 64; tiny 4)")
    p.add_argument("--rollout-samples", type=int, default=None, help="samples per prompt (default 8; tiny 3)")
    p.add_argument("--rollout-prompt", type=int, default=None, help="tokens per prompt (default 512; tiny 16)")
    p.add_argument("--rollout-new", type=int, default=None,
                   help="most new tokens of a request, limits drawn from [new/8, new] (default 1024; tiny 16)")
    p.add_argument("--rollout-temperature", type=float, default=1.0, help="rollout sampling temperature")
    p.add_argument("--rollout-max-rows", type=int, default=0, help="kz's rows decoded at once (0: every request)")
    p.add_argument("--rollout-seed", type=int, default=0, help="seed of the rollout's prompts, limits and samples")
    p.add_argument("--hf-rollout-batch", type=int, default=None,
                   help="transformers' rollout sequences per generate call (default 256; tiny 4; 0: all)")
    p.add_argument("--train", default="lora,full", help="training phases, comma-separated: lora, full (empty: none)")
    p.add_argument("--train-batch", type=int, default=None, help="sequences per training step (default 4)")
    p.add_argument("--train-len", type=int, default=None, help="tokens per training sequence (default 1024)")
    p.add_argument("--train-steps", type=int, default=None, help="timed training steps after one warm-up (default 5)")
    p.add_argument("--train-full-preset", default=None, choices=sorted(PRESETS),
                   help="model of the full fine-tuning phase (default qwen2.5-0.5b; tiny: tiny-tied); "
                        "the main preset trains it in the main run")
    p.add_argument("--no-train-checkpointing", action="store_true",
                   help="train without activation checkpointing (both frameworks)")
    p.add_argument("--no-train-masters", action="store_true",
                   help="kz keeps bf16 weights, gradients and moments only, rounded stochastically (as lean "
                        "as torch.optim.AdamW on bf16 weights)")
    p.add_argument("--kz-timeout", type=int, default=360, help="seconds before each kz_model_bench run is killed")
    p.add_argument("--work-dir", default=None, help="where the temporary checkpoint goes (default: system temp)")
    a = p.parse_args()
    tiny = a.tiny
    a.device = a.device or ("cpu" if tiny else "cuda:0")
    a.batches = [int(b) for b in (a.batches or ("1,2" if tiny else "1,16,64")).split(",")]
    a.prompt = a.prompt or (16 if tiny else 512)
    a.new = a.new or (8 if tiny else 256)
    a.prefill_batch = a.prefill_batch or (2 if tiny else 8)
    a.prefill_len = a.prefill_len or (32 if tiny else 2048)
    a.preset = "tiny" if tiny else "qwen2.5-7b"
    a.rollout_prompts = a.rollout_prompts or (4 if tiny else 64)
    a.rollout_samples = a.rollout_samples or (3 if tiny else 8)
    a.rollout_prompt = a.rollout_prompt or (16 if tiny else 512)
    a.rollout_new = a.rollout_new or (16 if tiny else 1024)
    if a.hf_rollout_batch is None:
        a.hf_rollout_batch = 4 if tiny else 256
    a.train = [m for m in a.train.split(",") if m]
    if any(m not in TRAIN_MODES for m in a.train):
        p.error(f"--train {','.join(a.train)}: phases are {', '.join(TRAIN_MODES)}")
    a.train_batch = a.train_batch or (2 if tiny else 4)
    a.train_len = a.train_len or (32 if tiny else 1024)
    a.train_steps = a.train_steps or (2 if tiny else 5)
    a.train_full_preset = a.train_full_preset or ("tiny-tied" if tiny else "qwen2.5-0.5b")
    return a


def full_elsewhere(args):
    """Whether full fine-tuning runs on its own checkpoint rather than in the main run."""
    return "full" in args.train and args.train_full_preset != args.preset


def log(msg):
    print(f"[model_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device):
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_bytes(device):
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


def release_memory(device):
    """Frees what dropped references still hold (a failed phase's tensors, a deleted model)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def copy_bandwidth(device, tiny):
    """Bytes read + written per second by a large device-to-device copy (best of 3 timings)."""
    n = (64 << 20) if tiny else (2 << 30)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    iters, best = (3 if tiny else 20), None
    for _ in range(4):  # the first round is a warm-up
        sync(device)
        start = time.perf_counter()
        for _ in range(iters):
            dst.copy_(src)
        sync(device)
        elapsed = time.perf_counter() - start
        best = elapsed if best is None else min(best, elapsed)
    del src, dst
    return 2 * n * iters / best


def make_model(preset, device):
    """A random-init model in bf16 built on the device (init on the CPU would take minutes)."""
    from transformers import AutoModelForCausalLM, Qwen2Config
    config = Qwen2Config(**PRESETS[preset], bos_token_id=None, eos_token_id=None, pad_token_id=None)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
    return model.eval()


def weight_bytes(model):
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    embed = model.get_input_embeddings().weight
    tied = model.get_output_embeddings().weight.data_ptr() == embed.data_ptr()
    per_token = total if tied else total - embed.numel() * embed.element_size()
    return total, per_token


def kz_phase_flags(args, inference, train_modes):
    """kz_model_bench's flags for the inference phases (or none) and the training phases."""
    flags = []
    if inference:
        flags += ["--batches", ",".join(map(str, args.batches)), "--prompt", str(args.prompt), "--new", str(args.new),
                  "--temperature", str(args.temperature),
                  "--prefill-batch", str(args.prefill_batch), "--prefill-len", str(args.prefill_len)]
        if args.rollout:
            flags += ["--rollout", "--rollout-prompts", str(args.rollout_prompts),
                      "--rollout-samples", str(args.rollout_samples), "--rollout-prompt", str(args.rollout_prompt),
                      "--rollout-new", str(args.rollout_new), "--rollout-temperature", str(args.rollout_temperature),
                      "--rollout-max-rows", str(args.rollout_max_rows), "--rollout-seed", str(args.rollout_seed)]
    else:
        flags.append("--no-inference")
    if train_modes:
        flags += ["--train", ",".join(train_modes), "--train-batch", str(args.train_batch),
                  "--train-len", str(args.train_len), "--train-steps", str(args.train_steps)]
        if args.no_train_checkpointing:
            flags.append("--no-train-checkpointing")
        if args.no_train_masters:
            flags.append("--no-train-masters")
    return flags


def run_kz(args, ckpt, out_dir, name, inference, train_modes):
    """Runs kz_model_bench (output OUTDIR/NAME.json, stderr NAME.err); on a crash, once more without
    CUDA graphs when it decodes. Returns its JSON or None."""
    attempts = [args.no_graph] if args.no_graph or not inference else [False, True]
    out, err_path = os.path.join(out_dir, name + ".json"), os.path.join(out_dir, name + ".err")
    for no_graph in attempts:
        cmd = [args.kz_bin, "--model", ckpt, "--device", args.device, *kz_phase_flags(args, inference, train_modes),
               "--out", out]
        if no_graph:
            cmd.append("--no-graph")
        log("running " + " ".join(cmd))
        try:
            with open(err_path, "a") as err:
                rc = subprocess.run(cmd, stderr=err, timeout=args.kz_timeout).returncode
        except subprocess.TimeoutExpired:  # a hang: no time left for a second attempt
            log(f"kz_model_bench timed out after {args.kz_timeout} s")
            return None
        if rc == 0:
            with open(out) as f:
                return json.load(f)
        log(f"kz_model_bench exited with {rc} (see {name}.err)")
    return None


def hf_generate(model, ids, new, cache, temperature=0.0):
    """transformers' generate: greedy, or sampled at `temperature` over the whole vocabulary (top_k 0
    and top_p 1 turn off the generation config's filters)."""
    sampling = dict(do_sample=True, temperature=temperature, top_p=1.0, top_k=0) if temperature > 0 else \
        dict(do_sample=False, temperature=None, top_p=None, top_k=None)
    kwargs = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                  pad_token_id=0, eos_token_id=None, **sampling)
    if cache == "static":
        kwargs["cache_implementation"] = "static"
    return model.generate(**kwargs)


def timed(device, fn):
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - start, out


@torch.no_grad()
def hf_prefill(model, args, device, repeats=3):
    reset_peak(device)
    ids = torch.randint(0, model.config.vocab_size, (args.prefill_batch, args.prefill_len), device=device)
    once = lambda: model(input_ids=ids, use_cache=True, logits_to_keep=1)  # noqa: E731 (the cache is built, as in generate)
    once()
    seconds, _ = timed(device, lambda: [once() for _ in range(repeats)])
    return dict(phase="prefill", batch=args.prefill_batch, tokens=args.prefill_len, repeats=repeats, seconds=seconds,
                tokens_per_s=args.prefill_batch * args.prefill_len * repeats / seconds, peak_bytes=peak_bytes(device))


@torch.no_grad()
def hf_decode(model, args, device, batch, prompt=None):
    reset_peak(device)
    ids = torch.randint(0, model.config.vocab_size, (batch, args.prompt), device=device)
    if prompt is not None and batch == 1 and len(prompt) == args.prompt:
        ids = torch.tensor([prompt], device=device)  # kz's batch-1 prompt, to compare tokens
    hf_generate(model, ids, 2, args.hf_cache, args.temperature)  # warm-up for this shape
    t1, _ = timed(device, lambda: hf_generate(model, ids, 1, args.hf_cache, args.temperature))
    tn, out = timed(device, lambda: hf_generate(model, ids, args.new, args.hf_cache, args.temperature))
    steps = args.new - 1
    r = dict(phase="decode", batch=batch, prompt_tokens=args.prompt, new_tokens=args.new, timed_steps=steps,
             prefill_seconds=t1, decode_seconds=tn - t1, tokens_per_s=batch * steps / max(tn - t1, 1e-9),
             e2e_tokens_per_s=batch * args.new / tn, cache=args.hf_cache, peak_bytes=peak_bytes(device))
    if batch == 1:
        r["tokens"] = out[0, args.prompt:].tolist()
    return r


def rollout_request_count(args):
    return args.rollout_prompts * args.rollout_samples


def rollout_work(kz, args, vocab_size):
    """Prompts and per-request limits of the rollout: kz's, or where kz_model_bench did not get as
    far as drawing them, the same distribution drawn here (transformers still gets measured)."""
    work = (kz or {}).get("rollout_work")
    if work:
        return work
    g = torch.Generator().manual_seed(args.rollout_seed)
    prompts = torch.randint(0, vocab_size, (args.rollout_prompts, args.rollout_prompt), generator=g)
    limits = torch.randint(max(1, args.rollout_new // 8), args.rollout_new + 1, (rollout_request_count(args),),
                           generator=g)
    return dict(prompts=prompts.tolist(), max_new_tokens=limits.tolist())


@torch.no_grad()
def hf_rollout(model, args, device, work):
    """The rollout with transformers' generate: consecutive batches of hf_rollout_batch sequences,
    each generated to its longest row's limit; only each row's own limit counts as generated."""
    limits = work["max_new_tokens"]
    ids = torch.tensor(work["prompts"], device=device).repeat_interleave(args.rollout_samples, 0)
    size = args.hf_rollout_batch or len(limits)
    batches = [(slice(s, s + size), limits[s:s + size]) for s in range(0, len(limits), size)]

    def generate(rows, new):
        return hf_generate(model, ids[rows], new, args.hf_cache, args.rollout_temperature)

    generate(slice(0, args.rollout_samples), min(32, args.rollout_new))  # warm-up
    reset_peak(device)
    torch.manual_seed(args.rollout_seed)
    seconds, _ = timed(device, lambda: [generate(rows, max(own)) for rows, own in batches])
    computed = sum(len(own) * max(own) for _, own in batches)
    return dict(phase="rollout", batch=len(limits), hf_batch=size, seconds=seconds, generated_tokens=sum(limits),
                computed_tokens=computed, tokens_per_s=sum(limits) / seconds, cache=args.hf_cache,
                peak_bytes=peak_bytes(device))


def lora_model(model):
    """`model` with fresh peft adapters as kz_model_bench's (float32 over the bf16 base: peft's
    autocast_adapter_dtype). peft injects them into `model` itself; unload() takes them out again."""
    from peft import LoraConfig, get_peft_model
    config = LoraConfig(r=LORA_RANK, lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules=LORA_TARGETS,
                        task_type="CAUSAL_LM")
    return get_peft_model(model, config)


@contextlib.contextmanager
def trainable(model, mode):
    """`model` made ready for `mode`: with adapters for lora (taken out again on exit), every
    parameter trainable for full."""
    if mode == "full":
        yield model.requires_grad_(True)
        return
    peft_model = lora_model(model)
    try:
        yield peft_model
    finally:
        peft_model.unload()


def hf_train(model, args, device, mode):
    """kz_model_bench's training phase with transformers: the same batch shape, loss, optimiser,
    clipping, checkpointing and step count. Leaves `model` without adapters, gradients or
    checkpointing, in eval mode (the full phase leaves it trained)."""
    reset_peak(device)
    try:
        if not args.no_train_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        with trainable(model, mode) as trained:
            return train_steps(trained, args, device, mode)
    finally:
        model.zero_grad(set_to_none=True)
        model.gradient_checkpointing_disable()
        model.disable_input_require_grads()  # the hook gradient_checkpointing_enable added
        model.eval()


def train_steps(trained, args, device, mode):
    """One warm-up step, then the timed ones, of the parameters of `trained` that require grad."""
    params = [p for p in trained.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=LEARNING_RATE, weight_decay=0.0, fused=device.type == "cuda")
    ids = torch.randint(0, trained.config.vocab_size, (args.train_batch, args.train_len), device=device)

    def step():
        loss = trained(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    first_loss = step().item()
    seconds, losses = timed(device, lambda: [step() for _ in range(args.train_steps)])
    return dict(phase=f"train_{mode}", batch=args.train_batch, tokens=args.train_len, timed_steps=args.train_steps,
                seconds=seconds, step_seconds=seconds / args.train_steps,
                tokens_per_s=args.train_batch * args.train_len * args.train_steps / seconds,
                first_loss=first_loss, last_loss=losses[-1].item(),
                trained_parameters=sum(p.numel() for p in params),
                activation_checkpointing=not args.no_train_checkpointing, peak_bytes=peak_bytes(device))


def guarded(phase, batch, fn):
    try:
        return fn()
    except Exception as e:  # one failing phase must not lose the others
        log(f"transformers {phase} (batch {batch}) failed: {e!r}")
        return dict(phase=phase, batch=batch, error=repr(e))


def run_hf(model, args, device, kz, inference, train_modes):
    phases = []
    if inference:
        prompt = (kz or {}).get("sample", {}) or {}
        phases.append(guarded("prefill", args.prefill_batch, lambda: hf_prefill(model, args, device)))
        for b in args.batches:
            log(f"transformers decode at batch {b}")
            phases.append(guarded("decode", b, lambda: hf_decode(model, args, device, b, prompt.get("prompt"))))
        if args.rollout:
            log("transformers rollout")
            work = rollout_work(kz, args, model.config.vocab_size)
            requests = rollout_request_count(args)
            phases.append(guarded("rollout", requests, lambda: hf_rollout(model, args, device, work)))
            release_memory(device)
    for mode in train_modes:
        log(f"transformers train {mode}")
        phases.append(guarded(f"train_{mode}", args.train_batch, lambda: hf_train(model, args, device, mode)))
        release_memory(device)  # what a failed phase left behind
    return dict(framework="transformers", phases=phases)


def common_prefix(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def find(result, phase, batch):
    for p in (result or {}).get("phases", []):
        if p.get("phase") == phase and p.get("batch") == batch:
            return p
    return {}


def gib(b):
    return "-" if b is None else f"{b / 2**30:.1f}"


def rate(p):
    return "error" if "error" in p else ("-" if not p else f"{p['tokens_per_s']:,.0f}")


def error_note(error):
    """A phase's error, short enough for the table; running out of memory is the one to expect
    (full fine-tuning of the 7B) and its messages only say so after their context."""
    return "error: out of memory" if "out of memory" in error.lower() else "error: " + error[:60]


def train_rows(args, main_run, full_run):
    """Table rows (phase, batch, name, kz result, transformers result) of the training phases; the
    full phase's come from full_run when it had its own checkpoint."""
    rows = []
    for mode in args.train:
        elsewhere = mode == "full" and full_elsewhere(args)
        name = f"train {mode} {args.train_batch}x{args.train_len}"
        if elsewhere:
            name += f" ({args.train_full_preset.removeprefix('qwen2.5-')})"
        rows.append((f"train_{mode}", args.train_batch, name, *(full_run if elsewhere else main_run)))
    return rows


def train_notes(k, h):
    """Losses of the first and last step on each side, and a warning when the trained parameter
    counts differ (the two recipes would not be the same)."""
    notes = [f"{side} loss {p['first_loss']:.3f}->{p['last_loss']:.3f}" for side, p in (("kz", k), ("hf", h))
             if "first_loss" in p]
    if "trained_parameters" in k and "trained_parameters" in h and k["trained_parameters"] != h["trained_parameters"]:
        notes.append(f"trained parameters differ: kz {k['trained_parameters']:,}, hf {h['trained_parameters']:,}")
    return notes


def table(args, main_run, full_run, bandwidth, per_token_bytes):
    """The summary printed last: one row per phase, then the decode, bandwidth and training lines.
    main_run and full_run are (kz, transformers) results of the main checkpoint and of the full
    fine-tuning one."""
    kz, hf = main_run
    rows = [("prefill", args.prefill_batch, f"prefill {args.prefill_batch}x{args.prefill_len}", kz, hf)]
    rows += [("decode", b, f"decode b{b}", kz, hf) for b in args.batches]
    if args.rollout:
        name = f"rollout {args.rollout_prompts}x{args.rollout_samples} p{args.rollout_prompt} n<={args.rollout_new}"
        rows.append(("rollout", rollout_request_count(args), name, kz, hf))
    rows += train_rows(args, main_run, full_run)
    lines = [f"{'phase':<26} {'kz tok/s':>10} {'hf tok/s':>10} {'kz/hf':>7} {'kz GiB':>7} {'hf GiB':>7}  notes"]
    for phase, batch, name, kz_result, hf_result in rows:
        k, h = find(kz_result, phase, batch), find(hf_result, phase, batch)
        ratio = f"{k['tokens_per_s'] / h['tokens_per_s']:.2f}x" if "tokens_per_s" in k and "tokens_per_s" in h else "-"
        notes = []
        if phase == "decode" and "tokens_per_s" in k:
            notes.append("graph" if k.get("cuda_graph") else "eager")
            if k.get("graph_error"):
                notes.append("graph failed: " + k["graph_error"].splitlines()[0][:60])
            notes.append(f"eager-agree {k.get('eager_agreement', 0):.2f}")
        if phase == "rollout":
            notes += rollout_notes(k, h)
        if phase.startswith("train_"):
            notes += train_notes(k, h)
        if "error" in k or "error" in h:
            notes.append(error_note(k.get("error") or h.get("error")))
        lines.append(f"{name:<26} {rate(k):>10} {rate(h):>10} {ratio:>7} {gib(k.get('peak_bytes')):>7} "
                     f"{gib(h.get('peak_bytes')):>7}  {', '.join(notes)}")
    limit = bandwidth / per_token_bytes
    how = f"sampled at temperature {args.temperature:g}" if args.temperature > 0 else "greedy"
    lines.append(f"decode: {args.new} new tokens after a {args.prompt}-token prompt, {how}; tokens/s over the "
                 f"{args.new - 1} decode steps (prefill excluded); transformers cache: {args.hf_cache}")
    lines.append(f"copy bandwidth {bandwidth / 1e9:,.0f} GB/s; {per_token_bytes / 1e9:.2f} GB of weights read per "
                 f"decode step; batch-1 limit {limit:,.1f} tokens/s")
    for name, res in (("kz", kz), ("transformers", hf)):
        p = find(res, "decode", 1)
        if "tokens_per_s" in p:
            lines.append(f"batch-1 decode, {name}: {p['tokens_per_s']:,.1f} tokens/s = "
                         f"{100 * p['tokens_per_s'] / limit:.1f}% of the bandwidth limit")
    h1 = find(hf, "decode", 1)
    if args.temperature == 0 and kz and (kz.get("sample") or {}).get("tokens") and h1.get("tokens"):
        same = common_prefix(kz["sample"]["tokens"], h1["tokens"])
        lines.append(f"batch-1 greedy tokens, kz vs transformers on the same prompt: first {same} of "
                     f"{len(h1['tokens'])} identical (bf16 kernels differ; random weights give near-ties)")
    if args.rollout:
        lines += rollout_legend(args)
    if args.train:
        lines += train_legend(args)
    return "\n".join(lines)


def rollout_notes(k, h):
    """kz's batching (widest batch, joins, shrinks) and the share of transformers' computed tokens
    that were useful."""
    notes = []
    if "stats" in k:
        st = k["stats"]
        notes.append(f"kz rows<={st['peak_rows']} joins {st['joins']} shrinks {st['shrinks']}")
    if "computed_tokens" in h:
        notes.append(f"hf {100 * h['generated_tokens'] / h['computed_tokens']:.0f}% of computed tokens useful")
    return notes


def rollout_legend(args):
    rows = args.rollout_max_rows or "all"
    hf_batch = args.hf_rollout_batch or "all"
    return [f"rollout: {args.rollout_prompts} prompts x {args.rollout_samples} samples, temperature "
            f"{args.rollout_temperature:g}, per-request limits uniform in [{max(1, args.rollout_new // 8)}, "
            f"{args.rollout_new}] (random weights never stop); tokens/s = requests' own new tokens / wall "
            f"time incl. prefill",
            f"rollout: kz one generate() call, continuous batching, max rows {rows}; transformers generate in "
            f"batches of {hf_batch} sequences, each run to its longest row's limit (one max_new_tokens per call), "
            f"extra tokens not counted"]


def train_legend(args):
    checkpointing = "off" if args.no_train_checkpointing else "on"
    targets = ",".join(t.removesuffix("_proj") for t in LORA_TARGETS)
    return [f"train: {args.train_batch}x{args.train_len} random ids, 1 warm-up + {args.train_steps} timed steps; "
            f"token-mean cross-entropy, AdamW lr {LEARNING_RATE:g}, grad-norm clip {MAX_GRAD_NORM:g}; "
            f"activation checkpointing {checkpointing} (both)",
            f"train lora: r {LORA_RANK}, alpha {LORA_ALPHA} on {targets}, fp32 adapters; full: kz "
            + ("bf16 weights, gradients and moments, rounded stochastically" if args.no_train_masters
               else "fp32 master weights, gradients and moments")
            + ", transformers bf16 weights and moments (torch.optim.AdamW)"]


def bench_preset(args, preset, device, name, inference, train_modes, start):
    """Builds `preset` on the device and saves it to a temporary checkpoint, runs kz_model_bench on
    that (OUTDIR/NAME.json), then transformers on the model in memory. Returns the kz and
    transformers results and weight_bytes(model)."""
    model = make_model(preset, device)
    weights = weight_bytes(model)
    work = tempfile.mkdtemp(prefix="kz_model_bench_", dir=args.work_dir)
    ckpt = os.path.join(work, "checkpoint")
    try:
        model.save_pretrained(ckpt)
        log(f"{preset} built and saved ({weights[0] / 1e9:.2f} GB) after {time.time() - start:.0f} s")
        # The transformers model stays resident while kz runs: the device holds both easily, and
        # each process's peak-memory statistics count only its own allocations.
        kz = run_kz(args, ckpt, args.out, name, inference, train_modes)
        log(f"kz done after {time.time() - start:.0f} s")
        hf = None if args.skip_hf else run_hf(model, args, device, kz, inference, train_modes)
        log(f"transformers done after {time.time() - start:.0f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        del model
        release_memory(device)
    return kz, hf, weights


def main():
    args = parse_args()
    os.makedirs(args.out, exist_ok=True)
    device = torch.device(args.device)
    start = time.time()
    bandwidth = copy_bandwidth(device, args.tiny)
    log(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s")
    main_train = [m for m in args.train if not (m == "full" and full_elsewhere(args))]
    kz, hf, (total_bytes, per_token_bytes) = bench_preset(args, args.preset, device, "kz", True, main_train, start)
    kz_full = hf_full = None
    if full_elsewhere(args):
        kz_full, hf_full, _ = bench_preset(args, args.train_full_preset, device, "kz_full", False, ["full"], start)
    summary = table(args, (kz, hf), (kz_full, hf_full), bandwidth, per_token_bytes)
    result = dict(args=vars(args), copy_bandwidth_bytes_per_s=bandwidth, weight_bytes=total_bytes,
                  weight_bytes_per_decode_step=per_token_bytes, batch1_limit_tokens_per_s=bandwidth / per_token_bytes,
                  kz=kz, transformers=hf, kz_full=kz_full, transformers_full=hf_full, wall_seconds=time.time() - start,
                  gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                  torch=torch.__version__)
    with open(os.path.join(args.out, "model_bench.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.out, "table.txt"), "w") as f:
        f.write(summary + "\n")
    print(summary)
    runs = [(kz, hf)] + ([(kz_full, hf_full)] if full_elsewhere(args) else [])
    ok = all(k is not None and without_errors(k) and (h is None or without_errors(h)) for k, h in runs)
    return 0 if ok else 1


def without_errors(result):
    return all("error" not in p for p in result["phases"])


if __name__ == "__main__":
    sys.exit(main())
