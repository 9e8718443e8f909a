"""What does a CUDA context cost when many processes make one at once, and what changes that? (issue #3:
a cold batch's first 16 evaluations each make a context, and they take ~3 s each side by side)

Each wave starts N fresh processes that make the device's primary context through the driver API
(cuInit, then cuDevicePrimaryCtxRetain, what torch's runtime then takes) at one agreed moment, and
report the seconds of each call. Variants: the environment the processes get (--env, e.g.
CUDA_DEVICE_MAX_CONNECTIONS=1) and K busy processes beside them (--cpu-load), as a cold batch's
`cuda` builds are. No torch: the driver's own cost, which is what a worker waits for (a context
retained this way leaves torch ~0.02 s: bench/README.md, session 15).

    python3 bench/context_probe.py --concurrency 1,8,16 --env "" --env CUDA_DEVICE_MAX_CONNECTIONS=1 --out c.json

Prints one row per wave: median and longest of each call, and the wave's span (first start to last
context); --out writes every process's figures as JSON.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# One process: waits for the agreed moment, makes the primary context, prints its seconds.
CHILD = r"""
import ctypes, json, sys, time
start_at = float(sys.argv[1])
driver = ctypes.CDLL("libcuda.so.1")
while time.time() < start_at:
    time.sleep(0.0005)
def timed(call, *args):
    began = time.perf_counter()
    status = call(*args)
    if status != 0:
        raise SystemExit(f"{call.__name__}: CUresult {status}")
    return time.perf_counter() - began
device, context = ctypes.c_int(), ctypes.c_void_p()
out = {"late_s": time.time() - start_at}
out["init_s"] = timed(driver.cuInit, 0)
timed(driver.cuDeviceGet, ctypes.byref(device), 0)
out["context_s"] = timed(driver.cuDevicePrimaryCtxRetain, ctypes.byref(context), device)
out["done_at"] = time.time()
print(json.dumps(out))
"""


def wave(count: int, env_assignment: str, cpu_load: int) -> dict:
    env = dict(os.environ)
    if env_assignment:
        name, _, value = env_assignment.partition("=")
        env[name] = value
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cpu_load)]
    try:
        start_at = time.time() + 0.5 + 0.02 * count  # every interpreter up and waiting by then
        children = [subprocess.Popen([sys.executable, "-c", CHILD, str(start_at)], env=env,
                                     stdout=subprocess.PIPE, text=True) for _ in range(count)]
        results = []
        for child in children:
            out, _ = child.communicate(timeout=120)
            if child.returncode != 0:
                raise SystemExit(f"a probe process failed (exit {child.returncode}): {out}")
            results.append(json.loads(out))
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    return {"count": count, "env": env_assignment, "cpu_load": cpu_load, "start_at": start_at,
            "processes": results, "span_s": max(r["done_at"] for r in results) - start_at}


def row(result: dict) -> str:
    def stats(key):
        values = [p[key] for p in result["processes"]]
        return f"{statistics.median(values):6.3f} {max(values):6.3f}"
    return (f"{result['count']:>3}  {result['cpu_load']:>4}  {result['env'] or '(driver defaults)':<32}  "
            f"{stats('init_s')}   {stats('context_s')}   {result['span_s']:6.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,8,16", help="processes per wave, comma-separated")
    parser.add_argument("--env", action="append", default=None,
                        help="NAME=VALUE the processes get (repeat for variants; \"\" for none)")
    parser.add_argument("--cpu-load", default="0", help="busy processes beside each wave, comma-separated")
    parser.add_argument("--rounds", type=int, default=2, help="each wave this many times")
    parser.add_argument("--out", help="every figure as JSON")
    args = parser.parse_args()
    results = []
    print("  N  load  environment                       cuInit med/max  ctx retain med/max  span s")
    for _ in range(args.rounds):
        for load in (int(k) for k in args.cpu_load.split(",")):
            for env_assignment in args.env or [""]:
                for count in (int(n) for n in args.concurrency.split(",")):
                    results.append(wave(count, env_assignment, load))
                    print(row(results[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
