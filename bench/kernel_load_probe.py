"""What a fork server's child pays to load the harness's check kernels (process.prepare_device's
"kernels" step), op by op: CUDA loads a kernel's module at its first launch (lazy loading), so the
first call of each ATen op in a new process costs more than its later calls. From the repository root:

  python3 bench/kernel_load_probe.py DEVICE [--at-once 1,8] [--load N]

Each wave forks N children at once from this process (torch imported, no CUDA, as the zygote's fork
servers are); each child makes its CUDA context, then runs harness.load_check_kernels with every ATen
op synchronised and timed at its first and second call. --load N: N busy processes at nice -5 beside
them, as a cold batch's `cuda` pre-builds are. Prints, per wave, the context and the step's wall time
(median over the children) and the ops whose first call cost most over their second."""
import argparse
import json
import os
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "worker"))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from kz_worker import cheats, compare, formats, harness, process  # noqa: E402


class FirstCalls(TorchDispatchMode):
    """Times each ATen op's calls (synchronised before and after), keyed by op and input dtypes."""

    def __init__(self, device):
        super().__init__()
        self.device, self.calls = device, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        dtypes = tuple(str(a.dtype).replace("torch.", "") for a in args if isinstance(a, torch.Tensor))
        key = f"{func}{list(dtypes)}"
        torch.cuda.synchronize(self.device)
        started = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        torch.cuda.synchronize(self.device)
        self.calls.setdefault(key, []).append(time.perf_counter() - started)
        return out


def child(device_name: str, results_fd: int) -> None:
    """prepare_device as a fork server's child runs it (its steps' seconds), then the check kernels'
    steps again line by line in a second context-free pass, then each ATen op's first call (in a
    dispatch mode, whose own first use costs seconds: only its per-op differences count)."""
    device = torch.device(device_name)
    if os.geteuid() == 0:
        os.nice(-5)  # as [worker] prepare_niceness runs a first wave's preparation
    process.prepare_device(device_name)
    steps = dict(process.device_steps_s)
    lines = {}
    for name, run in _check_lines(device):
        torch.cuda.synchronize(device)
        started = time.perf_counter()
        run()
        torch.cuda.synchronize(device)
        lines[name] = time.perf_counter() - started
    mode = FirstCalls(device)
    with mode:
        harness.load_check_kernels(device)
    with mode:  # the same again: every kernel loaded now
        harness.load_check_kernels(device)
    ops = {key: (calls[0], min(calls[1:]) if len(calls) > 1 else None) for key, calls in mode.calls.items()}
    references = {}
    for name, run in _reference_ops(device):
        calls = []
        for _ in range(2):
            torch.cuda.synchronize(device)
            started = time.perf_counter()
            run()
            torch.cuda.synchronize(device)
            calls.append(time.perf_counter() - started)
        references[name] = calls
    os.write(results_fd, (json.dumps({"steps": steps, "lines": lines, "ops": ops,
                                      "references": references}) + "\n").encode())


def _check_lines(device):
    """harness.load_check_kernels's calls one by one, on new tensors (the second pass: loaded kernels)."""
    state = {}

    def randn():
        with torch.device(device):
            state["reference"] = torch.randn(256)
        state["out"] = state["reference"].clone()
    return (("randn, clone", randn),
            ("compare_outputs", lambda: compare.compare_outputs(state["out"], state["reference"], harness._WARM_UP_TOLERANCE)),
            ("check_inputs_unchanged", lambda: compare.check_inputs_unchanged([state["out"]], [state["reference"]])),
            ("bitwise_equal", lambda: cheats.bitwise_equal(state["out"], state["reference"])),
            ("poison_free_memory", lambda: formats.poison_free_memory(device, [state["reference"]])),
            ("poison", lambda: cheats.poison([state["out"], state["reference"]])))


def _reference_ops(device):
    """First calls a reference module typically makes (cuBLAS, cuDNN, common ATen kernels)."""
    f = torch.nn.functional
    x = torch.randn(64, 256, device=device)
    w = torch.randn(128, 256, device=device)
    image = torch.randn(8, 16, 32, 32, device=device)
    kernel = torch.randn(32, 16, 3, 3, device=device)
    return (("linear (cuBLAS)", lambda: f.linear(x, w)),
            ("matmul", lambda: x @ w.t()),
            ("conv2d (cuDNN)", lambda: f.conv2d(image, kernel)),
            ("softmax", lambda: torch.softmax(x, dim=1)),
            ("layer_norm", lambda: f.layer_norm(x, (256,))),
            ("gelu", lambda: f.gelu(x)),
            ("max_pool2d", lambda: f.max_pool2d(image, 2)),
            ("sum dim", lambda: x.sum(dim=1)),
            ("randn", lambda: torch.randn(64, 256, device=device)),
            ("to device", lambda: torch.randn(64, 256).to(device)))


def wave(device_name: str, at_once: int) -> list:
    read_fd, write_fd = os.pipe()
    pids = []
    for _ in range(at_once):
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            code = 0
            try:
                child(device_name, write_fd)
            except BaseException as error:  # noqa: BLE001 (reported, then the child ends)
                print(f"child failed: {error!r}", file=sys.stderr)
                code = 1
            os._exit(code)
        pids.append(pid)
    os.close(write_fd)
    data = b""
    while chunk := os.read(read_fd, 1 << 16):
        data += chunk
    os.close(read_fd)
    for pid in pids:
        os.waitpid(pid, 0)
    return [json.loads(line) for line in data.decode().splitlines() if line.strip()]


def busy(count: int) -> list:
    pids = []
    for _ in range(count):
        pid = os.fork()
        if pid == 0:
            os.nice(-5) if os.geteuid() == 0 else None
            while True:
                pass
        pids.append(pid)
    return pids


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("device")
    parser.add_argument("--at-once", default="1,8")
    parser.add_argument("--load", type=int, default=0)
    args = parser.parse_args()
    process.prepare_host(args.device)  # as the zygote does before forking fork servers
    burners = busy(args.load)
    try:
        for at_once in (int(n) for n in args.at_once.split(",")):
            results = wave(args.device, at_once)
            if not results:
                print(f"{at_once} at once: no child reported")
                continue
            print(f"{at_once} at once (load {args.load}), median of {len(results)}: prepare_device's steps "
                  + ", ".join(f"{k} {statistics.median(r['steps'][k] for r in results):.3f} s" for k in results[0]["steps"]))
            print("  the check kernels' lines again (loaded): "
                  + ", ".join(f"{k} {statistics.median(r['lines'][k] for r in results) * 1000:.1f} ms" for k in results[0]["lines"]))
            first_extra = {}
            for r in results:
                for key, (first, later) in r["ops"].items():
                    first_extra.setdefault(key, []).append(first - (later or 0.0))
            ranked = sorted(first_extra.items(), key=lambda item: -statistics.median(item[1]))
            total = sum(statistics.median(v) for _, v in ranked)
            print(f"  first call over the later one, summed over {len(ranked)} ops: {total:.3f} s")
            for key, extra in ranked[:15]:
                print(f"    {statistics.median(extra) * 1000:8.1f} ms  {key}")
            print("  a reference's first calls (first, second; median ms):")
            for name in results[0]["references"]:
                first = statistics.median(r["references"][name][0] for r in results)
                second = statistics.median(r["references"][name][1] for r in results)
                print(f"    {first * 1000:8.1f} {second * 1000:8.1f}  {name}")
    finally:
        for pid in burners:
            os.kill(pid, 9)
            os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
