"""What a Triton cache of its own costs each evaluation (docs/evaluation.md, "Shared compile caches").

Each trial is a fresh process that times, on the GPU: Triton's driver set-up (its `cuda_utils`
helper: built with gcc, or imported from the cache) and the first launch of two kernels of different
signatures (their compile and their launchers: built, or loaded from the cache). "own cache" trials
start from an empty TRITON_CACHE_DIR; "own + helper" trials too, with the driver helper that setup
builds linked in (kz_worker.triton_helpers), as every evaluation now does; "shared" trials reuse a
dir an earlier trial filled, as evaluations did while the cache was shared. Prints the medians and
what each Triton evaluation now adds against the shared cache.

    python3 bench/triton_cache_probe.py [--trials 5] [--device cuda:0]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "worker"))
from kz_worker import triton_helpers  # noqa: E402

TRIAL = r'''
import json, sys, time
t0 = time.perf_counter()
import torch, triton, triton.language as tl
device = torch.device(sys.argv[1])
torch.empty(1, device=device)
t_imports = time.perf_counter()

@triton.jit
def relu(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask, other=0.0), 0.0), mask=mask)

@triton.jit
def scale_add(x_ptr, y_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * alpha + tl.load(y_ptr + offs, mask=mask), mask=mask)

from triton.runtime import driver
driver.active.utils  # the driver helper
torch.cuda.synchronize(device)
t_driver = time.perf_counter()
x = torch.randn(1 << 20, device=device)
out = torch.empty_like(x)
relu[(x.numel() // 1024,)](x, out, x.numel(), BLOCK=1024)
torch.cuda.synchronize(device)
t_first = time.perf_counter()
scale_add[(x.numel() // 1024,)](x, x, out, 0.5, x.numel(), BLOCK=1024)
torch.cuda.synchronize(device)
t_second = time.perf_counter()
print(json.dumps({"driver_s": t_driver - t_imports, "kernel1_s": t_first - t_driver,
                  "kernel2_s": t_second - t_first}))
'''


def trial(script: str, cache_dir: str, device: str, helpers: str = "") -> dict:
    if helpers:
        os.environ["KZ_TRITON_HELPERS_DIR"] = helpers
        triton_helpers.link_into(cache_dir)
        del os.environ["KZ_TRITON_HELPERS_DIR"]
    env = dict(os.environ, TRITON_CACHE_DIR=cache_dir)
    done = subprocess.run([sys.executable, script, device], env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"trial failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--device", default="cuda:0")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        script = os.path.join(root, "trial.py")  # @triton.jit reads its kernels' source from a file
        with open(script, "w") as f:
            f.write(TRIAL)
        shared = os.path.join(root, "shared")
        trial(script, shared, args.device)  # fills it
        helpers = triton_helpers.prepare(os.path.join(root, "helpers"))
        own = [trial(script, os.path.join(root, f"own{i}"), args.device) for i in range(args.trials)]
        linked = [trial(script, os.path.join(root, f"linked{i}"), args.device, helpers) for i in range(args.trials)]
        reused = [trial(script, shared, args.device) for _ in range(args.trials)]
    print(f"{'step (median of %d)' % args.trials:<32} {'own cache':>10} {'own+helper':>11} {'shared':>8} {'added':>7}")
    totals = [0.0, 0.0, 0.0]
    for key, label in (("driver_s", "driver helper (cuda_utils)"), ("kernel1_s", "1st kernel: compile + launcher"),
                       ("kernel2_s", "2nd kernel: compile + launcher"), (None, "all three")):
        if key is None:
            medians = totals
        else:
            medians = [statistics.median(t[key] for t in trials) for trials in (own, linked, reused)]
            totals = [total + m for total, m in zip(totals, medians)]
        print(f"{label:<32} {medians[0]:>9.3f}s {medians[1]:>10.3f}s {medians[2]:>7.3f}s {medians[1] - medians[2]:>6.3f}s")


if __name__ == "__main__":
    main()
