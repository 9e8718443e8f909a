"""Where does a worker's start-up go, and what would a fork server save? (issue #3: startup was
41-48% of kz's evaluation time on the H200)

Two ways to get a process ready for an evaluation, each measured N at a time (--concurrency):
  fresh: a new interpreter runs kz_worker's prepare() (imports, CUDA context, the audit's warm-up),
         the way every worker starts today;
  fork:  this process imports torch, Triton and kz_worker and runs the warm-up's CPU part once, then
         forks children that only create their CUDA context and run the warm-up's device part (what a
         fork server would leave to each child).
Each child also launches one tiny Triton kernel, to check that a forked child can run one.

    PYTHONPATH=worker python3 bench/worker_startup_probe.py --device cuda:0 --concurrency 1,8 --out s.json

Prints one table (seconds per phase, median over the children of each run, and the wall time of the
whole wave); --out writes every figure as JSON.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

PHASES = ("python", "import_torch", "import_triton", "import_kz", "cuda_context", "warm_up", "triton_kernel")


def child_phases(device: str, started: float, imported: bool) -> dict:
    """Runs the phases not yet done in this process; seconds per phase."""
    out = {}
    mark = time.perf_counter()

    def lap(name):
        nonlocal mark
        now = time.perf_counter()
        out[name] = now - mark
        mark = now

    if not imported:
        out["python"] = time.time() - started
        import torch  # noqa: F401
        lap("import_torch")
        import triton  # noqa: F401
        import triton.language  # noqa: F401
        lap("import_triton")
        from kz_worker import cheats, harness, validate  # noqa: F401
        lap("import_kz")
    import torch
    from kz_worker import cheats
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        torch.empty(1, device=dev)
    lap("cuda_context")
    cheats.warm_up(dev)
    lap("warm_up")
    if dev.type == "cuda":
        run_triton_kernel(dev)
        torch.cuda.synchronize()
    lap("triton_kernel")
    return out


def run_triton_kernel(dev):
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def add_one(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)

    x = torch.zeros(1000, device=dev)
    add_one[(4,)](x, 1000, BLOCK=256)
    assert float(x.sum()) == 1000.0, "the forked child's Triton kernel gave a wrong result"


def fresh_wave(device: str, n: int) -> tuple[list[dict], float]:
    start = time.time()
    code = ("import json,sys,time; sys.path.insert(0, %r); from worker_startup_probe import child_phases;"
            "print(json.dumps(child_phases(%r, float(sys.argv[1]), False)))"
            % (os.path.dirname(os.path.abspath(__file__)), device))
    procs = [subprocess.Popen([sys.executable, "-c", code, repr(time.time())], stdout=subprocess.PIPE, text=True)
             for _ in range(n)]
    results = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    return results, time.time() - start


def fork_wave(device: str, n: int) -> tuple[list[dict], float]:
    start = time.time()
    pipes = []
    for _ in range(n):
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            t0 = time.perf_counter()
            phases = child_phases(device, time.time(), True)
            phases["fork_to_ready"] = time.perf_counter() - t0
            os.write(write_fd, json.dumps(phases).encode())
            os._exit(0)
        os.close(write_fd)
        pipes.append((pid, read_fd))
    results = []
    for pid, fd in pipes:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        os.close(fd)
        _, status = os.waitpid(pid, 0)
        if status != 0 or not chunks:
            raise SystemExit(f"forked child {pid} failed (wait status {status})")
        results.append(json.loads(b"".join(chunks)))
    return results, time.time() - start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--concurrency", default="1,8", help="comma-separated wave sizes")
    p.add_argument("--out", help="write every figure as JSON")
    args = p.parse_args()
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "worker"))
    waves = [int(c) for c in args.concurrency.split(",")]
    rows = []
    for n in waves:
        results, wall = fresh_wave(args.device, n)
        rows.append({"mode": "fresh", "n": n, "wall_s": wall, "children": results})
    # The parent imports once (what the fork server would do at its own start), then forks.
    t0 = time.perf_counter()
    import torch  # noqa: F401
    import triton  # noqa: F401
    import triton.language  # noqa: F401
    from kz_worker import cheats, harness, validate  # noqa: F401
    cheats.warm_up(torch.device("cpu"))  # its CPU part: torch._dynamo's import
    parent_import_s = time.perf_counter() - t0
    for n in waves:
        results, wall = fork_wave(args.device, n)
        rows.append({"mode": "fork", "n": n, "wall_s": wall, "children": results})
    print(f"fork server's own imports: {parent_import_s:.2f} s (once)")
    header = ["mode", "n", "wave wall s"] + list(PHASES)
    print(" | ".join(header))
    for row in rows:
        cells = [row["mode"], str(row["n"]), f"{row['wall_s']:.2f}"]
        for phase in PHASES:
            values = [c[phase] for c in row["children"] if phase in c]
            cells.append(f"{statistics.median(values):.3f}" if values else "-")
        print(" | ".join(cells))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"parent_import_s": parent_import_s, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
