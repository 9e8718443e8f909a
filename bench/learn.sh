#!/usr/bin/env bash
# The learning experiment on one GPU (bench/README.md "Learning"): supervised starts trained here
# from scratch, then kz evolve with CA-GRPO and its ablations from them, at equal training budgets.
# Resumable across calls: every stage keeps its results under runs/ and is skipped once complete,
# a cut-off one resumes (kz sft and kz evolve from their newest checkpoints), so a call that ends
# at its deadline loses at most an iteration of each run. Stages:
#   1. teacher corpus and held-out modules (cuda-rtc, unfused and fused, 2 block sizes, --scale 32)
#      runs/teach-gpu, runs/teach-gpu-heldout; beside training, a sample of the corpus and every
#      held-out module checked on the card (runs/learn/check-*)
#   2. tokenizer (runs/tokenizer-gpu), then the Coder's and the Proposer's SFT at once
#      (configs/sft-{coder,proposer}-gpu.toml)
#   3. one `kz serve-eval` on the card (a fixed port: the runs' configs keep its URL across calls),
#      and the runs of KZ_LEARN_RUNS at once, each configs/evolve-learn-gpu.toml with its --set:
#        ca_grpo-S  ungated-S  correctness_only-S  static-S     for S in KZ_LEARN_SEEDS
#   4. bench/learn_summary.py: the table, the curves (learn.html), the share of fused kernels
# Usage: bench/learn.sh OUTDIR DEADLINE   (DEADLINE: epoch seconds by which this call must end)
# Env: KZ_LEARN_MODULES (2000), KZ_LEARN_HELDOUT (32), KZ_LEARN_CHECK (64: corpus modules checked
#      on the card), KZ_LEARN_SEEDS ("1 2"), KZ_LEARN_RUNS ("ca_grpo ungated correctness_only static"),
#      KZ_LEARN_SET (extra --set for every run),
#      KZ_LEARN_DEVICE (cuda:0) and KZ_LEARN_CONFIGS (configs): a dry run on the CPU points them at
#      cpu and at copies of the configs made small.
set -uo pipefail
OUT=${1:?output directory}
DEADLINE=${2:?deadline, epoch seconds}
KZ=build/kz
MODULES=${KZ_LEARN_MODULES:-2000}
HELDOUT=${KZ_LEARN_HELDOUT:-32}
SEEDS=${KZ_LEARN_SEEDS:-1 2}
RUNS=${KZ_LEARN_RUNS:-ca_grpo ungated correctness_only static}
PORT=${KZ_LEARN_PORT:-18431}
DEVICE=${KZ_LEARN_DEVICE:-cuda:0}
CONFIGS=${KZ_LEARN_CONFIGS:-configs}
# --scale 32: most references above the Proposer validity's 0.05 ms floor on an H100 (at 16 a third of
# the Proposer's modules fell under it), the teacher's naive GEMMs still a few ms.
TEACH_FLAGS=(--formats cuda-rtc --variants 2 --scale 32)
# Eight engines and an evaluation service share the host's cores: a few threads each for the CPU's share.
export OMP_NUM_THREADS=2 NCCL_NVLS_ENABLE=0
mkdir -p runs/learn "$OUT"

left() { echo $((DEADLINE - $(date +%s))); }
log() { echo "[learn $(date +%H:%M:%S), $(left) s left] $*"; }

teach() {  # teach DIR SPLIT COUNT SEED: into DIR.partial, then renamed (a cut-off run redoes it)
  local dir=$1 split=$2 count=$3 seed=$4
  [[ -f "$dir/corpus.jsonl" ]] && return 0
  rm -rf "$dir.partial"
  $KZ teach --out "$dir.partial" --split "$split" --count "$count" --seed "$seed" "${TEACH_FLAGS[@]}" \
    > "$OUT/teach-$(basename "$dir").log" 2>&1 && mv "$dir.partial" "$dir"
}

check_on_card() {  # the teacher's candidates evaluated on the card: a corpus sample, every held-out module
  local split name count seed
  for split in train heldout; do
    name=check-$split
    [[ -f runs/learn/$name/check.jsonl ]] && continue
    if [[ $split == train ]]; then count=${KZ_LEARN_CHECK:-64} seed=1; else count=$HELDOUT seed=2; fi
    # Beside the SFT, never past it by much: a check cut by its time limit is redone by the next call.
    rm -rf "runs/learn/$name"
    timeout -s INT $(($(left) - 200)) $KZ teach --out "runs/learn/$name" --split "$split" --count "$count" \
      --seed "$seed" "${TEACH_FLAGS[@]}" --check --device "$DEVICE" --jobs 4 > "runs/learn/$name.log" 2>&1
    echo "$name exit $?" >> runs/learn/check.status
  done
}

sft() {  # sft ROLE: trains, or resumes, until done or the deadline
  local dir=runs/sft-$1-gpu
  [[ -f "$dir/final/config.json" ]] && return 0
  local args=(--config "$CONFIGS/sft-$1-gpu.toml")
  [[ -d "$dir" ]] && args=(--resume "$dir")
  timeout -s INT $(($(left) - 20)) $KZ sft "${args[@]}" >> "$OUT/sft-$1.log" 2>&1
}

run_args() {  # run_args NAME SEED: kz evolve's arguments for a new run
  local name=$1 seed=$2
  local sets=(--set "run.seed=$seed" --set "eval.url=http://127.0.0.1:$PORT")
  case $name in
    ca_grpo) ;;
    ungated|correctness_only) sets+=(--set "reward.mode=$name") ;;
    static) sets+=(--set coder.curriculum=static --set coder.static_suite=runs/teach-gpu/suite) ;;
    *) echo "unknown run $name" >&2; return 1 ;;
  esac
  for extra in ${KZ_LEARN_SET:-}; do sets+=(--set "$extra"); done
  echo --config "$CONFIGS/evolve-learn-gpu.toml" --out "runs/learn/$name-$seed" "${sets[@]}"
}

evolve_all() {
  $KZ serve-eval --port "$PORT" --device "$DEVICE" > "$OUT/serve-eval.log" 2>&1 &
  local service=$!
  for _ in $(seq 600); do grep -q "serving evaluations" "$OUT/serve-eval.log" && break; sleep 0.1; done
  grep -q "serving evaluations" "$OUT/serve-eval.log" || { log "kz serve-eval did not start"; tail -5 "$OUT/serve-eval.log"; return 1; }
  local pids=() name seed run
  for seed in $SEEDS; do
    for name in $RUNS; do
      run=runs/learn/$name-$seed
      if [[ -f $run/config.toml ]]; then set -- --resume "$run"; else set -- $(run_args "$name" "$seed"); fi
      timeout -s INT $(($(left) - 25)) $KZ evolve "$@" >> "$OUT/evolve-$name-$seed.log" 2>&1 &
      pids+=($!)
    done
  done
  local failed=0
  for pid in "${pids[@]}"; do wait "$pid" || failed=$((failed + 1)); done
  kill "$service" 2>/dev/null; wait "$service" 2>/dev/null
  log "evolve: ${#pids[@]} runs, $failed ended before their budget (the deadline, or an error: see evolve-*.log)"
}

log "teacher"
teach runs/teach-gpu train "$MODULES" 1 || { log "teach failed"; tail -5 "$OUT"/teach-*.log; exit 1; }
teach runs/teach-gpu-heldout heldout "$HELDOUT" 2 || { log "teach (held out) failed"; exit 1; }
check_on_card &
checking=$!
if [[ ! -f runs/tokenizer-gpu/tokenizer.json ]]; then
  log "tokenizer"
  $KZ train-tokenizer --corpus runs/teach-gpu/corpus.jsonl --out runs/tokenizer-gpu --vocab-size 8192 \
    > "$OUT/tokenizer.log" 2>&1 || { log "tokenizer failed"; tail -5 "$OUT/tokenizer.log"; exit 1; }
fi
log "sft (coder and proposer at once)"
sft coder & coder=$!
sft proposer & proposer=$!
wait $coder; wait $proposer
wait $checking
[[ -f runs/sft-coder-gpu/final/config.json && -f runs/sft-proposer-gpu/final/config.json ]] || {
  log "sft not finished: the next call resumes it"; exit 0; }
(( $(left) > 90 )) && { log "kz evolve"; evolve_all; }
log "summary"
python3 bench/learn_summary.py runs/learn --out "$OUT" > "$OUT/summary.txt" 2> "$OUT/summary.err"
cat "$OUT/summary.txt"; tail -3 "$OUT/summary.err"
