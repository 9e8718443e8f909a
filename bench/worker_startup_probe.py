"""Where does a worker's start-up go, and which way of making a process ready is fastest? (issue #3:
the first wave of a cold batch waits ~6 s before any evaluation's own work)

Three ways to get a process ready for an evaluation through kz_worker.process (the code the worker
runs), each measured N at a time (--concurrency):
  fresh:       a new interpreter runs prepare_host (imports, the audit's CPU machinery) and then
               prepare_device (CUDA context, the launch spin's clock and gate), then the profiler's
               warm-up a `cuda` request makes in its load_reference stage: `python -m kz_worker`;
  fresh-early: the same with process.EarlyContext: the CUDA context made in a thread during the imports;
  fork:        this process runs prepare_host once, then forks children that run prepare_device only
               (a fork server's children; the parent's own imports are printed apart).
--cpu-load K keeps K niced busy processes running meanwhile, as a cold batch's `cuda` builds do.
Each child also launches one tiny Triton kernel, to check that its process can run one.

    PYTHONPATH=worker python3 bench/worker_startup_probe.py --device cuda:0 --concurrency 1,8 --out s.json

Prints one table (seconds per phase, median over the children of each wave; "ready" is from the
wave's start to the child being ready, the longest of the wave) and --out writes every figure as JSON.
"""
import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time

MODES = ("fresh", "fresh-early", "fork")
PHASES = ("python", "host", "early_join", "context", "profiler", "clock", "triton_kernel")


def child_phases(device: str, wave_started: float, mode: str) -> dict:
    """Prepares this process the way `mode` does and returns seconds per phase."""
    from kz_worker import process
    out = {}
    mark = time.perf_counter()

    def lap(name):
        nonlocal mark
        now = time.perf_counter()
        out[name] = now - mark
        mark = now

    if mode != "fork":
        out["python"] = time.time() - wave_started
        early = process.EarlyContext(device) if mode == "fresh-early" else None
        process.prepare_host(device)
        lap("host")
        if early is not None:
            early.join()
            lap("early_join")
            out["early_context"] = early.seconds
            out["early_error"] = early.error
    mark = time.perf_counter()
    process.prepare_device(device)
    out.update(process.device_steps_s)
    if device.startswith("cuda"):
        import torch
        from kz_worker import cheats
        mark = time.perf_counter()
        cheats.warm_up(torch.device(device))  # a profiled audit's warm-up (cheats.profiles_audit)
        lap("profiler")
        run_triton_kernel(device)
        lap("triton_kernel")
    out["ready"] = time.time() - wave_started
    return out


def run_triton_kernel(device: str):
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def add_one(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)

    x = torch.zeros(1000, device=device)
    add_one[(4,)](x, 1000, BLOCK=256)
    assert float(x.sum()) == 1000.0, "the child's Triton kernel gave a wrong result"


def fresh_wave(device: str, n: int, mode: str) -> tuple[list[dict], float]:
    start = time.time()
    code = ("import json,sys; sys.path.insert(0, %r); from worker_startup_probe import child_phases;"
            "print(json.dumps(child_phases(%r, float(sys.argv[1]), %r)))"
            % (os.path.dirname(os.path.abspath(__file__)), device, mode))
    procs = [subprocess.Popen([sys.executable, "-c", code, repr(start)], stdout=subprocess.PIPE, text=True)
             for _ in range(n)]
    results = []
    for proc in procs:
        stdout = proc.communicate()[0]
        if proc.returncode != 0 or not stdout.strip():
            raise SystemExit(f"a {mode} child failed (exit {proc.returncode})")
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    return results, time.time() - start


def fork_wave(device: str, n: int) -> tuple[list[dict], float]:
    start = time.time()
    pipes = []
    for _ in range(n):
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            os.write(write_fd, json.dumps(child_phases(device, start, "fork")).encode())
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


def busy_loop() -> None:
    os.nice(10)  # as the batch's pre-builds may be: below the evaluations
    while True:
        pass


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--concurrency", default="1,8", help="comma-separated wave sizes")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--cpu-load", type=int, default=0, help="busy processes kept running meanwhile")
    p.add_argument("--repeat", type=int, default=1, help="waves per mode and size, interleaved")
    p.add_argument("--out", help="write every figure as JSON")
    args = p.parse_args()
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "worker"))
    waves, modes = [int(c) for c in args.concurrency.split(",")], args.modes.split(",")
    load = [multiprocessing.Process(target=busy_loop, daemon=True) for _ in range(args.cpu_load)]
    for proc in load:
        proc.start()
    rows, parent_host_s = [], None
    try:
        for _ in range(args.repeat):
            for n in waves:
                for mode in (m for m in modes if m != "fork"):
                    results, wall = fresh_wave(args.device, n, mode)
                    rows.append({"mode": mode, "n": n, "wall_s": wall, "children": results})
        if "fork" in modes:
            from kz_worker import process
            started = time.perf_counter()
            process.prepare_host(args.device)  # the fork server's own imports, once
            parent_host_s = time.perf_counter() - started
            for _ in range(args.repeat):
                for n in waves:
                    results, wall = fork_wave(args.device, n)
                    rows.append({"mode": "fork", "n": n, "wall_s": wall, "children": results})
    finally:
        for proc in load:
            proc.kill()
    if parent_host_s is not None:
        print(f"fork: the parent's prepare_host {parent_host_s:.2f} s (once, before its waves)")
    print(f"busy processes meanwhile: {args.cpu_load}")
    header = ["mode", "n", "ready (max)"] + list(PHASES) + ["early_context"]
    print(" | ".join(header))
    for row in rows:
        cells = [row["mode"], str(row["n"]), f"{max(c['ready'] for c in row['children']):.2f}"]
        for phase in PHASES + ("early_context",):
            values = [c[phase] for c in row["children"] if c.get(phase) is not None]
            cells.append(f"{statistics.median(values):.3f}" if values else "-")
        print(" | ".join(cells))
        errors = {c["early_error"] for c in row["children"] if c.get("early_error")}
        if errors:
            print(f"  early context failed: {'; '.join(sorted(errors))}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"parent_host_s": parent_host_s, "cpu_load": args.cpu_load, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
