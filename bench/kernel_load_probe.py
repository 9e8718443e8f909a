"""What a fork server's child pays for its device before a request (process.prepare_device: the CUDA
context, the launch spin's clock and gate, the harness's check kernels), and what a reference's
first calls add after it. CUDA loads a kernel's module at its first launch (lazy loading), so the
first call of each ATen op in a new process costs more than its later calls. From the repository root:

  python3 bench/kernel_load_probe.py DEVICE [--at-once 1,8] [--load N]

This process prepares its host as the zygote does (process.prepare_host); each wave forks N children
at once from it, as fork servers' children are: N run prepare_device and then a reference's typical
first calls (cuBLAS, cuDNN, common ATen kernels), N others make a bare CUDA context and time each of
the check kernels' ATen ops at its first and second call. --load N: N busy processes at nice -5
beside them (the children run at -5 too, as [worker] prepare_niceness does), as a cold batch's
`cuda` pre-builds are. Prints medians over each wave's children."""
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

from kz_worker import harness, process  # noqa: E402


class FirstCalls(TorchDispatchMode):
    """Times each ATen op's calls (synchronised before and after), keyed by op and input dtypes."""

    def __init__(self, device):
        super().__init__()
        self.device, self.calls = device, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        dtypes = tuple(str(a.dtype).replace("torch.", "") for a in args if isinstance(a, torch.Tensor))
        out, seconds = _timed(self.device, lambda: func(*args, **(kwargs or {})))
        self.calls.setdefault(f"{func}{list(dtypes)}", []).append(seconds)
        return out


def child(device_name: str, kind: str, results_fd: int) -> None:
    """kind "prepare": prepare_device as a fork server's child runs it (its steps' seconds), then a
    reference's typical first calls; kind "ops": the CUDA context alone, then the check kernels with
    each ATen op's first and second call timed (in a dispatch mode, whose own first use costs
    seconds: only the per-op differences count)."""
    device = torch.device(device_name)
    if os.geteuid() == 0:
        os.nice(-5)  # as [worker] prepare_niceness runs a first wave's preparation
    report = {}
    if kind == "prepare":
        process.prepare_device(device_name)
        report["steps"] = dict(process.device_steps_s)
        report["references"] = {name: _first_two_calls(device, run) for name, run in _reference_ops(device)}
    else:
        torch.cuda.set_device(device)
        torch.empty(1, device=device)
        mode = FirstCalls(device)
        for _ in range(2):  # the second pass: every kernel loaded
            with mode:
                harness.load_check_kernels(device)
        report["ops"] = {key: (calls[0], min(calls[1:]) if len(calls) > 1 else None)
                         for key, calls in mode.calls.items()}
    os.write(results_fd, (json.dumps(report) + "\n").encode())


def _timed(device, run):
    """(run()'s result, its seconds), the device synchronised before and after."""
    torch.cuda.synchronize(device)
    started = time.perf_counter()
    out = run()
    torch.cuda.synchronize(device)
    return out, time.perf_counter() - started


def _first_two_calls(device, run) -> list:
    return [_timed(device, run)[1] for _ in range(2)]


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


def wave(device_name: str, kind: str, at_once: int) -> list:
    read_fd, write_fd = os.pipe()
    pids = []
    for _ in range(at_once):
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            code = 0
            try:
                child(device_name, kind, write_fd)
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


def busy(count: int, pids: list) -> None:
    """Starts `count` busy loops at nice -5 (as root), their pids into `pids` as they start."""
    for _ in range(count):
        pid = os.fork()
        if pid == 0:
            if os.geteuid() == 0:
                os.nice(-5)
            while True:
                pass
        pids.append(pid)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("device")
    parser.add_argument("--at-once", default="1,8")
    parser.add_argument("--load", type=int, default=0)
    args = parser.parse_args()
    process.prepare_host(args.device)  # as the zygote does before forking fork servers
    burners = []
    try:
        busy(args.load, burners)
        for at_once in (int(n) for n in args.at_once.split(",")):
            prepared, ops = wave(args.device, "prepare", at_once), wave(args.device, "ops", at_once)
            if not prepared or not ops:
                print(f"{at_once} at once: a wave's children did not report")
                continue
            print(f"{at_once} at once (load {args.load}), median of {len(prepared)}: prepare_device's steps "
                  + ", ".join(f"{k} {statistics.median(r['steps'][k] for r in prepared):.3f} s"
                              for k in prepared[0]["steps"]))
            print("  a reference's first calls after it (first, second; median ms):")
            for name in prepared[0]["references"]:
                first, second = (statistics.median(r["references"][name][i] for r in prepared) for i in (0, 1))
                print(f"    {first * 1000:8.1f} {second * 1000:8.1f}  {name}")
            first_extra = {}
            for r in ops:
                for key, (first, later) in r["ops"].items():
                    first_extra.setdefault(key, []).append(first - (later or 0.0))
            ranked = sorted(first_extra.items(), key=lambda item: -statistics.median(item[1]))
            total = sum(statistics.median(v) for _, v in ranked)
            print(f"  the check kernels' ATen ops after a bare context: first call over the second, "
                  f"summed over {len(ranked)} ops {total:.3f} s; the largest:")
            for key, extra in ranked[:12]:
                print(f"    {statistics.median(extra) * 1000:8.1f} ms  {key}")
    finally:
        for pid in burners:
            os.kill(pid, 9)
            os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
