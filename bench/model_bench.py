"""kz's libtorch engine against Hugging Face transformers on one random-init checkpoint (issue #5,
"Speed"): prefill and greedy-decode tokens/s, peak CUDA memory per phase, and batch-1 decode as a
fraction of the memory-bandwidth limit.

    python3 bench/model_bench.py --kz-bin build/model/kz_model_bench --out OUTDIR          # H200
    python3 bench/model_bench.py --kz-bin build/model/kz_model_bench --out OUTDIR --tiny   # CPU test

Steps: measure copy bandwidth; build a random-init Qwen2.5-7B-shaped model in bf16 with
transformers directly on the device and save it (a temporary checkpoint, removed at the end);
run kz_model_bench on that checkpoint in a subprocess (again without CUDA graphs if it crashes);
benchmark the transformers model already in memory; print a table. Both frameworks: prompts of
random ids, greedy, eos ignored (min_new_tokens = max_new_tokens), the same new-token count.

Decode tokens/s counts only decode steps: kz times its decode loop directly; transformers
(generate has no hook between prefill and decode) as batch x (N - 1) / (t(N new) - t(1 new)).
The batch-1 bandwidth limit is copy bandwidth (bytes read + written by a large device copy) over
the weight bytes one decode step reads (every weight except the input embedding table, of which
a step reads one row; the KV cache is ignored, < 1% at batch 1).

Outputs in OUTDIR: model_bench.json (everything), kz.json and kz.err (the tool's output),
table.txt (what is printed last).
"""
import argparse
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
    # The same family at toy size, for the CPU test of every code path.
    "tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                 rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False, use_sliding_window=False),
}


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
    p.add_argument("--kz-timeout", type=int, default=240, help="seconds before kz_model_bench is killed")
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
    return a


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


def run_kz(args, ckpt, out_dir):
    """Runs kz_model_bench; on a crash, once more without CUDA graphs. Returns its JSON or None."""
    attempts = [args.no_graph] if args.no_graph else [False, True]
    for no_graph in attempts:
        cmd = [args.kz_bin, "--model", ckpt, "--device", args.device, "--batches", ",".join(map(str, args.batches)),
               "--prompt", str(args.prompt), "--new", str(args.new), "--prefill-batch", str(args.prefill_batch),
               "--prefill-len", str(args.prefill_len), "--out", os.path.join(out_dir, "kz.json")]
        if no_graph:
            cmd.append("--no-graph")
        log("running " + " ".join(cmd))
        try:
            with open(os.path.join(out_dir, "kz.err"), "a") as err:
                rc = subprocess.run(cmd, stderr=err, timeout=args.kz_timeout).returncode
        except subprocess.TimeoutExpired:  # a hang: no time left for a second attempt
            log(f"kz_model_bench timed out after {args.kz_timeout} s")
            return None
        if rc == 0:
            with open(os.path.join(out_dir, "kz.json")) as f:
                return json.load(f)
        log(f"kz_model_bench exited with {rc} (see kz.err)")
    return None


def hf_generate(model, ids, new, cache):
    kwargs = dict(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new,
                  min_new_tokens=new, pad_token_id=0, eos_token_id=None, temperature=None, top_p=None, top_k=None)
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
    hf_generate(model, ids, 2, args.hf_cache)  # warm-up for this shape
    t1, _ = timed(device, lambda: hf_generate(model, ids, 1, args.hf_cache))
    tn, out = timed(device, lambda: hf_generate(model, ids, args.new, args.hf_cache))
    steps = args.new - 1
    r = dict(phase="decode", batch=batch, prompt_tokens=args.prompt, new_tokens=args.new, timed_steps=steps,
             prefill_seconds=t1, decode_seconds=tn - t1, tokens_per_s=batch * steps / max(tn - t1, 1e-9),
             e2e_tokens_per_s=batch * args.new / tn, cache=args.hf_cache, peak_bytes=peak_bytes(device))
    if batch == 1:
        r["tokens"] = out[0, args.prompt:].tolist()
    return r


def guarded(phase, batch, fn):
    try:
        return fn()
    except Exception as e:  # one failing phase must not lose the others
        log(f"transformers {phase} (batch {batch}) failed: {e!r}")
        return dict(phase=phase, batch=batch, error=repr(e))


def run_hf(model, args, device, kz):
    prompt = (kz or {}).get("sample", {}) or {}
    phases = [guarded("prefill", args.prefill_batch, lambda: hf_prefill(model, args, device))]
    for b in args.batches:
        log(f"transformers decode at batch {b}")
        phases.append(guarded("decode", b, lambda: hf_decode(model, args, device, b, prompt.get("prompt"))))
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


def table(args, kz, hf, bandwidth, per_token_bytes):
    """The summary printed last: one row per phase, then the bandwidth line."""
    rows = [("prefill", args.prefill_batch, f"prefill {args.prefill_batch}x{args.prefill_len}")]
    rows += [("decode", b, f"decode b{b}") for b in args.batches]
    lines = [f"{'phase':<18} {'kz tok/s':>10} {'hf tok/s':>10} {'kz/hf':>7} {'kz GiB':>7} {'hf GiB':>7}  notes"]
    for phase, batch, name in rows:
        k, h = find(kz, phase, batch), find(hf, phase, batch)
        ratio = f"{k['tokens_per_s'] / h['tokens_per_s']:.2f}x" if "tokens_per_s" in k and "tokens_per_s" in h else "-"
        notes = []
        if phase == "decode" and "tokens_per_s" in k:
            notes.append("graph" if k.get("cuda_graph") else "eager")
            if k.get("graph_error"):
                notes.append("graph failed: " + k["graph_error"].splitlines()[0][:60])
            notes.append(f"eager-agree {k.get('eager_agreement', 0):.2f}")
        if "error" in k or "error" in h:
            notes.append("error: " + (k.get("error") or h.get("error"))[:60])
        lines.append(f"{name:<18} {rate(k):>10} {rate(h):>10} {ratio:>7} {gib(k.get('peak_bytes')):>7} "
                     f"{gib(h.get('peak_bytes')):>7}  {', '.join(notes)}")
    limit = bandwidth / per_token_bytes
    lines.append(f"decode: {args.new} new tokens after a {args.prompt}-token prompt, greedy; tokens/s over the "
                 f"{args.new - 1} decode steps (prefill excluded); transformers cache: {args.hf_cache}")
    lines.append(f"copy bandwidth {bandwidth / 1e9:,.0f} GB/s; {per_token_bytes / 1e9:.2f} GB of weights read per "
                 f"decode step; batch-1 limit {limit:,.1f} tokens/s")
    for name, res in (("kz", kz), ("transformers", hf)):
        p = find(res, "decode", 1)
        if "tokens_per_s" in p:
            lines.append(f"batch-1 decode, {name}: {p['tokens_per_s']:,.1f} tokens/s = "
                         f"{100 * p['tokens_per_s'] / limit:.1f}% of the bandwidth limit")
    h1 = find(hf, "decode", 1)
    if kz and (kz.get("sample") or {}).get("tokens") and h1.get("tokens"):
        same = common_prefix(kz["sample"]["tokens"], h1["tokens"])
        lines.append(f"batch-1 greedy tokens, kz vs transformers on the same prompt: first {same} of "
                     f"{len(h1['tokens'])} identical (bf16 kernels differ; random weights give near-ties)")
    return "\n".join(lines)


def main():
    args = parse_args()
    os.makedirs(args.out, exist_ok=True)
    device = torch.device(args.device)
    start = time.time()
    bandwidth = copy_bandwidth(device, args.tiny)
    log(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s")
    model = make_model(args.preset, device)
    total_bytes, per_token_bytes = weight_bytes(model)
    work = tempfile.mkdtemp(prefix="kz_model_bench_", dir=args.work_dir)
    ckpt = os.path.join(work, "checkpoint")
    try:
        model.save_pretrained(ckpt)
        log(f"model built and saved ({total_bytes / 1e9:.2f} GB) after {time.time() - start:.0f} s")
        # The transformers model stays resident while kz runs: the device holds both easily, and
        # each process's peak-memory statistics count only its own allocations.
        kz = run_kz(args, ckpt, args.out)
        log(f"kz done after {time.time() - start:.0f} s")
        hf = None if args.skip_hf else run_hf(model, args, device, kz)
        log(f"transformers done after {time.time() - start:.0f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    del model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    summary = table(args, kz, hf, bandwidth, per_token_bytes)
    result = dict(args=vars(args), copy_bandwidth_bytes_per_s=bandwidth, weight_bytes=total_bytes,
                  weight_bytes_per_decode_step=per_token_bytes, batch1_limit_tokens_per_s=bandwidth / per_token_bytes,
                  kz=kz, transformers=hf, wall_seconds=time.time() - start,
                  gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                  torch=torch.__version__)
    with open(os.path.join(args.out, "model_bench.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.out, "table.txt"), "w") as f:
        f.write(summary + "\n")
    print(summary)
    ok = kz is not None and all("error" not in p for p in kz["phases"])
    ok = ok and (hf is None or all("error" not in p for p in hf["phases"]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
