"""Triton's driver helper, built once at setup instead of in every evaluation.

Each request has its own Triton cache (eval/src/worker_client.cpp says why none is shared), so each
Triton evaluation would build Triton's `cuda_utils` C module with gcc (~0.35 s on the GPU host). Its
source is Triton's own, the same for every candidate: scripts/setup.sh builds it once
(`prepare`, through Triton, so it lands under Triton's own cache key) into build/triton-helpers,
which is read-only to workers under the sandbox. The supervisor hands that dir to its workers
(KZ_TRITON_HELPERS_DIR) where setup finished it, and each request links its files into its own
cache (`link_into`) before any reference or candidate code runs. A candidate can replace a link in
its own cache only: the next request links anew.

Launchers (one per kernel signature) and kernels are still built in each request: their sources
come from the candidate's kernels.
"""
import os
import shutil

COMPLETE = ".kz-complete"  # written last; the supervisor hands over only a finished dir


def prepare(out: str) -> str:
    """Builds Triton's driver helper into `out` (replacing what is there). Raises where it cannot
    (no GPU driver's libcuda to link against): `out` is then absent."""
    out = os.path.abspath(out)
    partial = out + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    os.environ["TRITON_CACHE_DIR"] = partial  # read by Triton at each cache lookup
    try:
        from triton.backends.nvidia.driver import CudaUtils
        CudaUtils()
        with open(os.path.join(partial, COMPLETE), "w"):
            pass
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    os.rename(partial, out)
    return out


def link_into(cache_dir: str) -> int:
    """Links the helpers' files (KZ_TRITON_HELPERS_DIR) into the request's Triton cache, under the
    same keys; how many. Only regular files one directory down, as Triton files them."""
    helpers = os.environ.get("KZ_TRITON_HELPERS_DIR")
    if not helpers or not cache_dir:
        return 0
    linked = 0
    for key in os.listdir(helpers):
        source_dir = os.path.join(helpers, key)
        if os.path.islink(source_dir) or not os.path.isdir(source_dir):
            continue
        for name in os.listdir(source_dir):
            source = os.path.join(source_dir, name)
            if os.path.islink(source) or not os.path.isfile(source):
                continue
            os.makedirs(os.path.join(cache_dir, key), exist_ok=True)
            os.symlink(source, os.path.join(cache_dir, key, name))
            linked += 1
    return linked
