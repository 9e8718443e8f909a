"""The harness Guard's cost per verify (it runs after every timed run, inside the timing's exclusive
GPU hold), part by part, in a process prepared as a worker is (process.py): from the repository
root, `python3 bench/guard_probe.py DEVICE [--no-freeze]` (cpu: with TRITON_INTERPRET=1); --no-freeze
prepares without process.freeze_heap, as workers did before it."""
import sys
import time

sys.path.insert(0, "worker")
from kz_worker import process  # noqa: E402

RUNS = 300


def per_call_us(function) -> float:
    start = time.perf_counter()
    for _ in range(RUNS):
        function()
    return (time.perf_counter() - start) / RUNS * 1e6


def main(device: str, freeze: bool) -> None:
    if not freeze:
        process.freeze_heap = lambda: None
    process.prepare_host(device)
    process.prepare_device(device)
    from kz_worker import cheats
    cheats.install_launch_hooks("cuda")
    guard = cheats.Guard("cuda")

    def codes():
        for _, function, code, defaults, kwdefaults in guard.codes:
            _ = (function.__code__ is code, function.__defaults__ is defaults, function.__kwdefaults__ is kwdefaults)

    def classes():
        for _, cls, keys in guard.class_keys:
            _ = set(vars(cls)) - keys

    def settings():
        for setting, value in guard.settings:
            cheats._same(setting.get(), value)

    print(f"{device}{'' if freeze else ' (heap not frozen)'}: {len(guard.entries)} watched names, {len(guard.codes)} functions, "
          f"{len(guard.class_keys)} classes, {len(guard.settings)} settings")
    for name, function in [("verify, first calls", lambda: guard.verify("probe")),
                           ("verify", lambda: guard.verify("probe")),
                           ("names (identity check)", lambda: cheats._identities_unchanged(guard.identities)),
                           ("functions' code", codes), ("classes' keys", classes), ("settings", settings),
                           ("modes", cheats.active_modes)]:
        print(f"  {name:24s} {per_call_us(function):8.1f} µs")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--no-freeze"]
    main(args[0] if args else "cpu", "--no-freeze" not in sys.argv)
