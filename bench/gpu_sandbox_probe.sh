#!/usr/bin/env bash
# Which sandbox step keeps CUDA from starting on this host? Run on the GPU host from the repository
# root after a build (bench/gpu_suite.sh builds). Tries CUDA's first call under each step alone
# (util-linux tools), then kz itself with parts of [sandbox] turned off.
set -u
PY=${KZ_PYTHON:-python3}
probe='import torch; torch.cuda.init(); print("cuda ok", torch.cuda.device_count())'
try() {  # try LABEL COMMAND...
  local label=$1; shift
  if out=$("$@" 2>&1); then echo "ok    $label"; else echo "FAIL  $label: $(echo "$out" | tail -1 | cut -c1-200)"; fi
}
echo "== host =="; uname -r; id; ls -l /dev/nvidia* 2>&1 | head; env | grep -E '^(LD_LIBRARY_PATH|CUDA|NVIDIA)' ; cat /proc/self/cgroup
try "plain" "$PY" -c "$probe"
try "env -i" env -i PATH="$PATH" HOME=/tmp "$PY" -c "$probe"
try "unshare -n (netns)" unshare -n "$PY" -c "$probe"
try "unshare -m + ro /" unshare -m sh -c "mount --make-rprivate / && mount -o remount,bind,ro / && $PY -c '$probe'"
try "setpriv no caps" setpriv --no-new-privs --bounding-set=-all --inh-caps=-all "$PY" -c "$probe"
try "prlimit nofile/fsize/cpu" prlimit --nofile=4096 --fsize=1073741824 --cpu=3600 "$PY" -c "$probe"
try "prlimit nproc 2048" prlimit --nproc=2048 "$PY" -c "$probe"
mkdir -p /sys/fs/cgroup/kzprobe 2>/dev/null && try "pids cgroup" sh -c "echo \$\$ > /sys/fs/cgroup/kzprobe/cgroup.procs && $PY -c '$probe'"
rmdir /sys/fs/cgroup/kzprobe 2>/dev/null
echo "== each mount read-only on its own (what kz's mount namespace does to all of them) =="
awk '{print $5}' /proc/self/mountinfo | sort -u | while read -r m; do
  try "ro $m" unshare -m sh -c "mount --make-rprivate / && mount -o remount,bind,ro '$m' && $PY -c '$probe'"
done
echo "== kz eval under [sandbox] variants =="
for variant in "enabled = false" "read_only_filesystem = false" "network = true" "gpu_memory_fraction = 0.0" ""; do
  printf '[sandbox]\n%s\n' "$variant" > /tmp/kz_probe.toml
  v=$(build/kz eval suite/kzbench/level1/02_relu.py suite/examples/cuda-rtc/02_relu.py --device cuda:0 --no-cache \
      --no-timing --config /tmp/kz_probe.toml --json 2>/dev/null | "$PY" -c 'import json,sys; d=json.load(sys.stdin); print(d["status"], d["message"][-160:].replace("\n"," "))')
  echo "kz [sandbox] ${variant:-defaults}: $v"
done
