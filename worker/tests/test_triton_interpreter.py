"""The pinned NumPy must let Triton's interpreter run loops with runtime bounds (numpy 2.5 did
not, on the GPU host): the CPU path of every Triton candidate depends on it."""
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import torch, triton, triton.language as tl

    @triton.jit
    def row_sum(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):          # runtime loop bound
            offs = start + tl.arange(0, BLOCK)
            acc += tl.load(x_ptr + row * n_cols + offs, mask=offs < n_cols, other=0.0)
        tl.store(out_ptr + row, tl.sum(acc, axis=0))

    x = torch.randn(3, 300)
    out = torch.empty(3)
    row_sum[(3,)](x, out, 300, BLOCK=64)
    assert torch.allclose(out, x.sum(1), atol=1e-4), (out, x.sum(1))
    print("ok")
""")


def test_interpreter_runs_loops_with_runtime_bounds():
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"
