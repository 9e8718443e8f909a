#!/usr/bin/env bash
# The GPU benchmarks and checks of bench/README.md. Run on the GPU host from the repository root
# (after scripts/fetch-gpu-deps.sh here, carrying .deps):  bench/gpu_suite.sh PART OUTDIR
#   PART = rtc:     build, kz_rtc GPU tests, cuda-rtc examples, the reference as its own candidate
#   PART = others:  build, triton examples, cuda (load_inline) examples
#   PART = checks:  build, the gpu-labelled CTest tests (sandbox CUDA fault, ...), the timing
#                   protocol's tests (worker/tests/test_timing.py), how a worker prepares
#                   (worker/tests/test_process.py, its GPU test too) and the GPU-only cheat fixtures
#                   (expected: torch_compute_in_forward, no_custom_kernel, wrong_during_timing;
#                   side_stream_hidden ok, with timing end device_sync), the sandbox parts this host
#                   refused (none expected), and where built, the workers' own /dev/shm tests,
#                   the scratch dir's bound and the syscall filter (eval_sandbox_test;
#                   Process::members and the filter's own test in sandbox_test)
#   PART = multigpu: build kz only; the fixed 34-candidate batch (bench/make_eval_batch.py), cold, on
#                   cuda:0 alone and then on cuda:0,cuda:1 (one worker pool per GPU): wall time,
#                   verdicts against the manifest, evaluations and exclusive timing per GPU, and
#                   the speedups of the two runs side by side (bench/multi_gpu_summary.py). Needs
#                   a host with two GPUs; KZ_MULTIGPU_DEVICES="cuda:0 cuda:0" runs it twice on one.
#   PART = model:   build, bench/model_bench.py: the libtorch engine (kz_model_bench) against
#                   transformers on a random-init Qwen2.5-7B-shaped checkpoint (~4 min after the build
#                   without the training phases, which then run on it and on a Qwen2.5-0.5B-shaped one);
#                   KZ_MODEL_ARGS adds model_bench.py flags (e.g. "--temperature 1 --no-train-masters";
#                   "--rollout --train=" runs the GRPO rollout, 64 prompts x 8 samples x up to 1,024 new
#                   tokens, without training; transformers' side, 8 batches of 64, may take ~10 min)
#   PART = serve:   build kz and kz-engine; bench/serve_bench.py: `kz serve-model` under 64 concurrent
#                   requests (half streamed) against `kz generate --prompts` (one engine call) on the same
#                   work, a random-init Qwen2.5-7B-shaped checkpoint (kz init-model, 15 GB under
#                   runs/serve-bench, kept for the next call), 256 new tokens each at temperature 1;
#                   KZ_SERVE_ARGS adds serve_bench.py flags (e.g. "--preset qwen2.5-0.5b --requests 32").
#   PART = compare: build kz only, then bench/kernelbench_compare.py: the fixed 34-candidate batch
#                   through kz and its cuda candidates through KernelBench's own harness (a checkout
#                   at $KERNELBENCH, default .kb/KernelBench: bench/fetch-kernelbench.sh, carried
#                   along), timing stability, reference-as-candidate, two more cold kz batches
#                   (the report's are the median one's; --kz-rounds); all within KZ_COMPARE_WALL_S
#                   (default 480 s, build included; the phases after the kz batch take what is
#                   left, and the report says what was cut). KB_LIMIT: KernelBench's share, its
#                   first N cuda candidates (default all 10: its parallel pre-build ~55-65 s whatever
#                   the count, then ~5 s per sample, ~13 s for one that fails to compile, which it
#                   rebuilds; ~115 s in all). Fewer flatter kz: the pre-build is spread over fewer.
#                   Then, with KZ_SERVICE_ROUNDS=N (default 0), the same batch N times through one
#                   `kz serve-eval` (bench/service_batch.py, ~30 s a round), its rates against this
#                   run's KernelBench (--kb-from): round 1 cold, the later ones a trainer's steady state.
#                   compare.json records the GPU's UUID and kz's commit (KZ_COMMIT where set, else git:
#                   the device's copy of the tree may carry an older .git, so write the hash that `git
#                   rev-parse --short=12 HEAD` gives here into the command:
#                   KZ_COMMIT=<hash> bench/gpu_suite.sh ...).
#   PART = service: build kz only; bench/service_batch.py alone (KZ_SERVICE_ROUNDS, default 2;
#                   KZ_SERVICE_DEVICE, default cuda:0; KB_FROM: a compare.json for the ratios).
#   PART = memory:  build kz only; bench/memory_batch.py: KernelBench's largest level-1 and level-2
#                   problems (a checkout at $KERNELBENCH, carried along), each reference as its own
#                   candidate plus cuda-rtc kernels for the elementwise ones, through `kz eval-suite`
#                   at the default concurrency and then one at a time (--jobs 1); KZ_MEMORY_LEVEL1,
#                   KZ_MEMORY_LEVEL2 and KZ_MEMORY_RTC size the batch (10, 2, 6); KZ_MEMORY_CONFIG: a
#                   TOML for kz (on an H200, [sandbox] gpu_memory_fraction = 0.51 gives each worker and
#                   the slots an H100's 71 GiB); KZ_MEMORY_RUNS picks
#                   "default", "alone" or both (the default), so the two fit separate calls: the batch,
#                   its verdicts, budgets and peaks, the out-of-memory count and both walls (report).
#   PART = learn:   build kz and kz-engine; bench/learn.sh, the learning experiment (bench/README.md
#                   "Learning"): teacher corpus, tokenizer, SFT of a Coder and a Proposer, then the
#                   kz evolve runs of CA-GRPO and its ablations at equal training budgets, all under
#                   runs/ on the host, so that the next call on the same machine goes on where this one
#                   stopped; this call ends by KZ_LEARN_WALL_S (default 560 s, build included). The
#                   archive holds the logs, metrics, reports and bench/learn_summary.py's table and
#                   curves (learn.html), no weights.
#   PART = evolve:  build kz and kz-engine; `kz evolve` for KZ_EVOLVE_ITERATIONS (3) iterations per
#                   run of KZ_EVOLVE_RUNS (default "scripted gpu-small"), each timed: "scripted", both
#                   roles at the scripted endpoint of loop/tests (modules chaining unary APIs, Triton
#                   kernels right or wrong in turn) evaluated and timed on the card
#                   (loop/tests/data/evolve-scripted-gpu.toml); "gpu-small",
#                   configs/evolve-gpu-small.toml on random-init Qwen2.5-0.5B-shaped models (LoRA;
#                   generation on the card; random weights write no code). Then
#                   bench/evolve_summary.py: seconds by stage per iteration, evaluations, rewards, pass@1.
#   PART = agree:   build kz only; bench/kernelbench_agreement.py: public KernelBench generations
#                   (.kb-samples/: bench/fetch-kb-samples.sh, carried along) judged by KernelBench's own
#                   harness ($KERNELBENCH, carried along) and by kz under --policy kernelbench with
#                   KernelBench's tolerances, correctness only; the agreement table. KZ_AGREE_LIMIT
#                   (default 110) samples, KZ_AGREE_CHUNK (24) at a time, after the manifest's first KZ_AGREE_SKIP (0: calls that
#                   share the manifest; --report-only A B joins their tables), KZ_AGREE_DEVICE
#                   (default cuda:0; cuda:all on a kind with several GPUs), all within
#                   KZ_AGREE_WALL_S (default 510 s, build included). What a call does is kept under
#                   runs/agree-state on the host (--state): the next call on the same machine goes on
#                   where this one stopped (KernelBench's builds, its verdicts and kz's), and its table
#                   covers every sample judged so far. The verdicts come back as OUTDIR/agree-state.tgz;
#                   carried as .kb-agree-state.tgz (KZ_AGREE_SEED) to a fresh host, they seed its state,
#                   so that a later machine judges only the samples still missing.
# Every evaluation is a real `kz eval-suite` run with timings; results.jsonl and tables in OUTDIR.
set -uo pipefail
PART=${1:?rtc, others, checks, compare, service, multigpu, memory, model, serve, evolve, learn or agree}
FINAL=${2:?output directory}
OUT=$(mktemp -d)   # everything lands here; FINAL gets one archive of it
mkdir -p "$FINAL"
export KZ_SKIP_APT=1 KZ_PYTHON="$(command -v python3)" KZ_DEPS_PREFIX="$PWD/.deps"
KERNELBENCH=${KERNELBENCH:-.kb/KernelBench}
if [[ $PART == compare ]]; then
  [[ -f "$KERNELBENCH/src/kernelbench/eval.py" ]] || {
    echo "no KernelBench checkout at $KERNELBENCH: run bench/fetch-kernelbench.sh where there is network, carry .kb/"
    exit 1; }
  export KZ_BUILD_TARGETS=kz   # the benchmark needs the CLI only: the tests' build is time it lacks
fi
[[ $PART == multigpu || $PART == service || $PART == memory ]] && export KZ_BUILD_TARGETS=kz
[[ $PART == model ]] && export KZ_BUILD_TARGETS=kz_model_bench
[[ $PART == evolve || $PART == learn || $PART == serve ]] && export KZ_BUILD_TARGETS="kz kz-engine"
# ---- PART = agree: its inputs, before the build ----
if [[ $PART == agree ]]; then
  KB_SAMPLES=${KB_SAMPLES:-.kb-samples}
  [[ -f "$KERNELBENCH/src/kernelbench/eval.py" && -f "$KB_SAMPLES/manifest.jsonl" ]] || {
    echo "agree needs $KERNELBENCH and $KB_SAMPLES: run bench/fetch-kernelbench.sh, then bench/fetch-kb-samples.sh where there is network, carry .kb/ and .kb-samples/"
    exit 1; }
  export KZ_BUILD_TARGETS=kz
fi
# ---- end of agree's inputs ----
scripts/setup.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build: ${SECONDS} s"
if [[ $PART == service ]] || { [[ $PART == compare ]] && (( ${KZ_SERVICE_ROUNDS:-0} > 0 )); }; then
  build/kz serve-eval --help > /dev/null 2>&1 || {
    echo "build/kz has no serve-eval: cpp-httplib was not found (scripts/fetch-gpu-deps.sh puts it in .deps/; carry .deps)"
    exit 1; }
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
# The host's CPUs: whether its 16 are 8 cores of two threads each says what "half busy" means.
lscpu 2>/dev/null | grep -E "^(Model name|CPU\(s\)|Thread\(s\) per core|Core\(s\) per socket|Socket\(s\)|CPU max MHz|L3 cache)" \
  | tee -a "$OUT/gpu.txt"

# The run's exit status: 1 when a step below failed (each still runs, and says so where it ends), so
# that a caller reading only the status does not take a lost phase for a finished one.
FAILED=0
step_done() {  # step_done NAME STATUS: prints "NAME exit STATUS" and remembers a failure
  echo "$1 exit $2"
  (( $2 == 0 )) || FAILED=1
}

suite() {  # suite NAME CANDIDATE_DIR [extra kz flags...]
  local name=$1 dir=$2; shift 2
  echo "== $name =="
  local start=$SECONDS
  build/kz eval-suite --suite suite/kzbench --candidates "$dir" \
    --device cuda:0 --no-cache --out "$OUT/$name.jsonl" "$@" > "$OUT/$name.txt" 2> "$OUT/$name.err"
  step_done "kz eval-suite ($name)" $?
  cat "$OUT/$name.txt"; tail -2 "$OUT/$name.err"; echo "$name: $((SECONDS - start)) s wall"
  tar -C "$OUT" -czf "$FINAL/results-$PART.tgz" .
}

# ---- PART = agree: kz and KernelBench's harness on the same public kernels ----
if [[ $PART == agree ]]; then
  WALL=${KZ_AGREE_WALL_S:-510}
  BUDGET=$((WALL - SECONDS - 25))   # 25 s kept for the archive
  ((BUDGET < 60)) && BUDGET=60
  echo "== agree: ${KZ_AGREE_LIMIT:-110} samples on ${KZ_AGREE_DEVICE:-cuda:0}, --budget-s $BUDGET (of ${WALL} s, build included) =="
  SEED=${KZ_AGREE_SEED:-.kb-agree-state.tgz}
  if [[ ! -d runs/agree-state && -f $SEED ]]; then   # a fresh host: the verdicts of earlier machines
    mkdir -p runs/agree-state && tar -C runs/agree-state -xzf "$SEED" && echo "state seeded from $SEED"
  fi
  mkdir -p runs/agree-state
  timeout -k 10 $((BUDGET + 30)) python3 bench/kernelbench_agreement.py --samples "$KB_SAMPLES" \
    --kernelbench "$KERNELBENCH" --out "$OUT/agree" --state runs/agree-state --device "${KZ_AGREE_DEVICE:-cuda:0}" \
    --limit "${KZ_AGREE_LIMIT:-110}" --skip "${KZ_AGREE_SKIP:-0}" --chunk "${KZ_AGREE_CHUNK:-24}" --budget-s "$BUDGET" > "$OUT/agree.txt" 2> "$OUT/agree.err"
  step_done kernelbench_agreement.py $?; echo "after ${SECONDS} s"; tail -3 "$OUT/agree.err"
  # The verdicts, without KernelBench's builds and kz's compile caches (large, and useless on another host).
  tar -C runs/agree-state -czf "$FINAL/agree-state.tgz" --exclude=kb-builds --exclude=kz-cache .
  tar -C "$OUT" -czf "$FINAL/results-$PART.tgz" .
  head -12 "$OUT/agree/agreement.txt"; sed -n '/^disagreements:/,$p' "$OUT/agree/agreement.txt"
  echo "full table: agree/agreement.txt in $FINAL/results-$PART.tgz"
  exit $FAILED
fi
# ---- end of agree ----

if [[ $PART == rtc ]]; then
  (cd worker && python3 -m pytest -q -p no:cacheprovider tests/test_kz_rtc.py 2>&1 | tail -5)
  suite cuda-rtc suite/examples/cuda-rtc
  mkdir -p /tmp/kz_refs && cp suite/kzbench/level*/*.py /tmp/kz_refs/
  suite reference-as-candidate /tmp/kz_refs --format torch
elif [[ $PART == checks ]]; then
  (cd build && ctest -L gpu --output-on-failure > "$OUT/ctest-gpu.log" 2>&1); step_done "ctest -L gpu" $?
  tail -40 "$OUT/ctest-gpu.log" | tee "$OUT/ctest-gpu.txt"
  (cd worker && python3 -m pytest -q -p no:cacheprovider tests/test_timing.py tests/test_process.py > "$OUT/timing-gpu.log" 2>&1)
  step_done "test_timing.py test_process.py" $?; tail -15 "$OUT/timing-gpu.log" | tee "$OUT/timing-gpu.txt"
  for f in eval/tests/cheats/cuda_aten_in_extension.py eval/tests/cheats/cuda_rtc_torch_compute.py \
           eval/tests/cheats/cache_by_pointer_late.py eval/tests/cheats/side_stream_hidden.py; do
    build/kz eval suite/kzbench/level1/02_relu.py "$f" --device cuda:0 --no-cache --json 2>> "$OUT/cheats-gpu.err" |
      tee -a "$OUT/cheats-gpu.jsonl"
  done
  grep "kz: sandbox" "$OUT/cheats-gpu.err" | sort -u | tee "$OUT/sandbox-gaps.txt"  # what this host refused
  # The workers' own /dev/shm on this host (a tmpfs in each worker's mount namespace) and the scratch
  # dir's bound (the supervisor's looks beside a worker on this host's file system, files removed but
  # still open among them, found through the worker's processes: Process::members), where built
  # (KZ_BUILD_TARGETS with sandbox_test and eval_sandbox_test).
  if [[ -x build/sandbox/sandbox_test && -x build/eval/eval_sandbox_test ]]; then
    { build/sandbox/sandbox_test --gtest_filter='SubprocessSandbox.FreshTmpfs*:*Members*:*SyscallFilter*' &&
      KZ_SOURCE_DIR=$PWD build/eval/eval_sandbox_test --gtest_filter='*SharedMemory*:*ScratchDir*:*UserNamespace*'; } > "$OUT/shm.log" 2>&1
    step_done "own /dev/shm and scratch bound tests" $?
    grep -E "^\[ +(OK|FAILED|SKIPPED|PASSED) " "$OUT/shm.log" | tee "$OUT/shm.txt"
  fi
  tar -C "$OUT" -czf "$FINAL/results-$PART.tgz" .
elif [[ $PART == compare ]]; then
  WALL=${KZ_COMPARE_WALL_S:-480}
  KB_LIMIT=${KB_LIMIT:-10}
  BUDGET=$((WALL - SECONDS - 25))   # 25 s kept for the archive and the table
  ((BUDGET < 60)) && BUDGET=60       # a slow build still gets the kz batch started
  echo "== compare: --kb-limit $KB_LIMIT (of 10 cuda candidates), --budget-s $BUDGET (of ${WALL} s, build included) =="
  # timeout: a phase that overruns its budget still leaves time for the archive below.
  timeout -k 10 $((BUDGET + 15)) python3 bench/kernelbench_compare.py --kernelbench "$KERNELBENCH" \
    --out "$OUT/compare" --device cuda:0 --kb-limit "$KB_LIMIT" --budget-s "$BUDGET" \
    > "$OUT/compare.txt" 2> "$OUT/compare.err"
  step_done kernelbench_compare.py $?; echo "after ${SECONDS} s"; tail -3 "$OUT/compare.err"
  tar -C "$OUT" -czf "$FINAL/results-$PART.tgz" .
  echo "full report: compare/report.txt in $FINAL/results-$PART.tgz"
  python3 bench/kernelbench_compare.py --report-only "$OUT/compare/compare.json" --short
  if (( ${KZ_SERVICE_ROUNDS:-0} > 0 )); then
    echo "== the batch through kz serve-eval, ${KZ_SERVICE_ROUNDS} rounds =="
    timeout -k 10 $((60 * KZ_SERVICE_ROUNDS + 60)) python3 bench/service_batch.py --out "$OUT/service" \
      --device cuda:0 --rounds "$KZ_SERVICE_ROUNDS" --kb-from "$OUT/compare/compare.json" \
      > "$OUT/service.txt" 2> "$OUT/service.err"
    step_done service_batch.py $?; cat "$OUT/service.txt"; tail -3 "$OUT/service.err"
    tar -C "$OUT" -czf "$FINAL/results-$PART.tgz" .
  fi
elif [[ $PART == service ]]; then
  python3 bench/service_batch.py --out "$OUT/service" --device "${KZ_SERVICE_DEVICE:-cuda:0}" \
    --rounds "${KZ_SERVICE_ROUNDS:-2}" ${KB_FROM:+--kb-from "$KB_FROM"} > "$OUT/service.txt" 2> "$OUT/service.err"
  step_done service_batch.py $?; cat "$OUT/service.txt"; tail -3 "$OUT/service.err"
  tar -C "$OUT" -czf "$FINAL/results-$PART.tgz" .
elif [[ $PART == multigpu ]]; then
  python3 bench/make_eval_batch.py "$OUT/batch" > /dev/null
  run=0
  for devices in ${KZ_MULTIGPU_DEVICES:-cuda:0 cuda:0,cuda:1}; do
    run=$((run + 1))
    name=batch-$run-${devices//[:,]/_}
    start=$SECONDS
    XDG_CACHE_HOME=$(mktemp -d) build/kz eval-suite --suite suite/kzbench --candidates "$OUT/batch/candidates" \
      --device "$devices" --no-cache --out "$OUT/$name.jsonl" > "$OUT/$name.txt" 2> "$OUT/$name.err"
    status=$?
    echo "$devices: exit $status, $((SECONDS - start)) s wall" | tee -a "$OUT/walls.txt"
    (( status == 0 )) || FAILED=1
  done
  python3 bench/multi_gpu_summary.py --manifest "$OUT/batch/manifest.jsonl" --walls "$OUT/walls.txt" \
    "$OUT"/batch-[0-9]*.jsonl | tee "$OUT/summary.txt"
  (( PIPESTATUS[0] == 0 )) || FAILED=1
  tar -C "$OUT" -czf "$FINAL/results-$PART.tgz" .
elif [[ $PART == memory ]]; then
  # The batch and the walls live beside the tree (MEMORY_DIR), so that a later call's "alone" runs
  # join the "default" ones of an earlier call on the same machine.
  MEMORY_DIR=${MEMORY_DIR:-runs/memory}
  mkdir -p "$MEMORY_DIR"
  [[ -d "$MEMORY_DIR/suite" ]] || python3 bench/memory_batch.py make "$MEMORY_DIR" --kernelbench "$KERNELBENCH" \
    --level1 "${KZ_MEMORY_LEVEL1:-10}" --level2 "${KZ_MEMORY_LEVEL2:-2}" --rtc "${KZ_MEMORY_RTC:-6}" 2>&1 | tail -3
  for mode in ${KZ_MEMORY_RUNS:-default alone}; do
    jobs=(); [[ $mode == alone ]] && jobs=(--jobs 1)
    for format in torch cuda-rtc; do
      name=$mode-${format/cuda-/}
      start=$SECONDS
      build/kz eval-suite --suite "$MEMORY_DIR/suite" --candidates "$MEMORY_DIR/$format" --format "$format" \
        --device cuda:0 --no-cache "${jobs[@]}" ${KZ_MEMORY_CONFIG:+--config "$KZ_MEMORY_CONFIG"} --out "$MEMORY_DIR/$name.jsonl" > "$MEMORY_DIR/$name.txt" 2> "$MEMORY_DIR/$name.err"
      step_done "kz eval-suite ($name)" $?
      echo "$name $((SECONDS - start))" >> "$MEMORY_DIR/walls.txt"
      tail -12 "$MEMORY_DIR/$name.txt"
      tar -C "$MEMORY_DIR" -czf "$FINAL/results-$PART.tgz" .  # after each run: a cut-off call keeps what ran
    done
  done
  python3 bench/memory_batch.py report "$MEMORY_DIR" | tee "$MEMORY_DIR/report.txt"
  tar -C "$MEMORY_DIR" -czf "$FINAL/results-$PART.tgz" .
elif [[ $PART == model ]]; then
  # Its checkpoint (15 GB) goes to the system temp dir, not into the archive; the table comes last.
  start=$SECONDS
  python3 bench/model_bench.py --kz-bin build/model/kz_model_bench --out "$OUT/model" ${KZ_MODEL_ARGS:-} \
    > "$OUT/model.txt" 2> "$OUT/model.err"
  step_done model_bench $?; echo "$((SECONDS - start)) s wall"; tail -4 "$OUT/model.err"
  tar -C "$OUT" -czf "$FINAL/results-$PART.tgz" .
  cat "$OUT/model.txt"
elif [[ $PART == serve ]]; then
  start=$SECONDS
  python3 bench/serve_bench.py --out "$OUT/serve" ${KZ_SERVE_ARGS:-} > "$OUT/serve.txt" 2> "$OUT/serve.err"
  step_done serve_bench.py $?; echo "$((SECONDS - start)) s wall"; tail -4 "$OUT/serve.err"
  tar -C "$OUT" -czf "$FINAL/results-$PART.tgz" .
  cat "$OUT/serve.txt"
elif [[ $PART == evolve ]]; then
  iterations=${KZ_EVOLVE_ITERATIONS:-3}
  runs=()
  for name in ${KZ_EVOLVE_RUNS:-scripted gpu-small}; do
    if [[ $name == scripted ]]; then
      python3 loop/tests/scripted_roles_server.py "$OUT/port" & server=$!
      for i in $(seq 50); do [[ -s $OUT/port ]] && break; sleep 0.1; done
      sed "s|ENDPOINT|http://127.0.0.1:$(cat "$OUT/port")/v1|" loop/tests/data/evolve-scripted-gpu.toml > "$OUT/scripted.toml"
      runs+=("scripted:$OUT/scripted.toml")
    else
      for role in proposer:1 coder:2; do
        build/kz init-model --preset qwen2.5-0.5b --out "runs/qwen-0.5b-${role%:*}" --seed "${role#*:}" > /dev/null
      done
      runs+=("gpu-small:configs/evolve-gpu-small.toml")
    fi
  done
  for run in "${runs[@]}"; do
    start=$SECONDS
    build/kz evolve --config "${run#*:}" --out "$OUT/${run%%:*}" --iterations "$iterations" \
      > "$OUT/${run%%:*}.txt" 2> "$OUT/${run%%:*}.err"
    step_done "kz evolve (${run%%:*})" $?; echo "${run%%:*}: $((SECONDS - start)) s wall"; tail -3 "$OUT/${run%%:*}.err"
    rm -rf "$OUT/${run%%:*}/checkpoints"  # the weights stay on the host: the archive holds logs and reports
    tar -C "$OUT" -czf "$FINAL/results-$PART.tgz" .
  done
  [[ -n ${server:-} ]] && kill "$server"
  python3 bench/evolve_summary.py $(for run in "${runs[@]}"; do echo "$OUT/${run%%:*}"; done) | tee "$OUT/summary.txt"
  tar -C "$OUT" -czf "$FINAL/results-$PART.tgz" .
elif [[ $PART == learn ]]; then
  bench/learn.sh "$OUT/learn" $(($(date +%s) + ${KZ_LEARN_WALL_S:-560} - SECONDS - 15))
  step_done learn.sh $?
  # Logs, metrics, reports and summaries; no weights, prompts or kernel files.
  tar -czf "$OUT/runs-learn.tgz" --exclude=checkpoints --exclude=iterations --exclude=final \
    --exclude='*.safetensors' runs/learn runs/sft-coder-gpu runs/sft-proposer-gpu 2>/dev/null
  tar -C "$OUT" -czf "$FINAL/results-$PART.tgz" .
else
  suite triton suite/examples/triton
  suite cuda suite/examples/cuda
fi
exit $FAILED
