#!/usr/bin/env bash
# The main job on its embedded default (CPU, no GPU, no network): the whole system at toy scale.
#   1. the kernel teacher writes a corpus and a held-out module set it never trains on, every
#      candidate checked by the evaluator (Triton interpreter)          runs/teach, runs/teach-heldout
#   2. a byte-level BPE tokenizer trained on the corpus                 runs/tokenizer
#   3. supervised starts: a tiny Coder and a tiny Proposer              runs/sft-coder, runs/sft-proposer
#   4. kz evolve from them for a few iterations, the held-out suite
#      measured before the first and after the last                     runs/main/evolve
#   5. kz report, and runs/main/summary.json (held-out pass@1 before and after the RL iterations)
# Each stage is skipped where its result is already complete and resumed where it was cut off, so
# running it again after a kill loses nothing already computed. Set-up (scripts/setup.sh) first.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
cd "$ROOT"
KZ=build/kz
TRAIN_MODULES=${KZ_MAIN_TRAIN_MODULES:-64}
HELDOUT_MODULES=${KZ_MAIN_HELDOUT_MODULES:-8}
mkdir -p runs/main
STAGES=runs/main/stages.tsv   # stage, seconds: the summary's timings
: > "$STAGES"

stage() {  # stage NAME COMMAND...: runs it, timed
  local name=$1 started=$SECONDS
  shift
  echo
  echo "== $name =="
  "$@"
  printf '%s\t%s\n' "$name" "$((SECONDS - started))" >> "$STAGES"
}

teach() {  # teach DIR SPLIT COUNT SEED [--check]: into DIR.partial, then renamed (a cut-off run redoes it)
  local dir=$1 split=$2 count=$3 seed=$4
  shift 4
  [[ -f "$dir/corpus.jsonl" ]] && { echo "$dir: done"; return; }
  rm -rf "$dir.partial"
  $KZ teach --out "$dir.partial" --split "$split" --count "$count" --seed "$seed" --formats triton --variants 1 "$@"
  mv "$dir.partial" "$dir"
}

tokenizer() {
  [[ -f runs/tokenizer/tokenizer.json ]] && { echo "runs/tokenizer: done"; return; }
  $KZ train-tokenizer --corpus runs/teach/corpus.jsonl --out runs/tokenizer --vocab-size 2048
}

sft() {  # sft ROLE: trains, or resumes from the newest checkpoint
  local dir=runs/sft-$1
  [[ -f "$dir/final/config.json" ]] && { echo "$dir: done"; return; }
  if [[ -d "$dir" ]]; then
    $KZ sft --resume "$dir"
  else
    $KZ sft --config "configs/sft-$1-tiny-cpu.toml"
  fi
}

evolve() {
  if [[ -f runs/main/evolve/config.toml ]]; then
    $KZ evolve --resume runs/main/evolve
  else
    $KZ evolve --config configs/evolve-sft-tiny-cpu.toml --out runs/main/evolve
  fi
}

stage "teacher corpus (train, checked)" teach runs/teach train "$TRAIN_MODULES" 1 --check --device cpu
stage "teacher modules (held out, checked)" teach runs/teach-heldout heldout "$HELDOUT_MODULES" 2 --check --device cpu
stage "tokenizer" tokenizer
stage "sft coder" sft coder
stage "sft proposer" sft proposer
stage "kz evolve" evolve
stage "kz report" $KZ report runs/main/evolve
"${KZ_PYTHON:-.venv/bin/python}" scripts/main_summary.py --run runs/main/evolve --stages "$STAGES" \
  --sft runs/sft-coder runs/sft-proposer --out runs/main/summary.json
