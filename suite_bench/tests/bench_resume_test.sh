#!/usr/bin/env bash
# kz bench end to end on the CPU against the scripted model server (replay_model_server.py):
# a run killed part-way and run again must redo no generation and no evaluation, and the final
# run directory must hold one verdict per sample, summary.json (pass_at_k / fast_p keyed) and an
# HTML report with charts. Its own cache dir: verdicts cached by an earlier run would make the first
# run finish before it can be killed.   usage: bench_resume_test.sh KZ_BINARY
set -uo pipefail
KZ=${1:?kz binary}
SRC=${KZ_SOURCE_DIR:?}
WORK=$(mktemp -d)
passed=0; failed=0
check() {  # check DESCRIPTION COMMAND...
  if "${@:2}"; then passed=$((passed + 1)); echo "ok: $1"; else failed=$((failed + 1)); echo "FAILED: $1"; fi
}
cleanup() { [[ -n "${SERVER:-}" ]] && kill "$SERVER" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

mkdir -p "$WORK/suite/level1" "$WORK/suite/level2"
cp "$SRC"/suite/kzbench/level1/{02_relu,04_silu,07_softmax}.py "$WORK/suite/level1/"
cp "$SRC"/suite/kzbench/level2/19_scale_residual_gelu.py "$WORK/suite/level2/"
python3 "$SRC/suite_bench/tests/replay_model_server.py" --suite "$WORK/suite" \
  --candidates "$SRC/suite/examples/triton" --port-file "$WORK/port" &
SERVER=$!
for _ in $(seq 300); do [[ -s "$WORK/port" ]] && break; sleep 0.1; done
URL="http://127.0.0.1:$(cat "$WORK/port")/v1"
stats() { python3 -c "import json,urllib.request; print(json.load(urllib.request.urlopen('$URL/stats'))['$1'])"; }
RUN=(env XDG_CACHE_HOME="$WORK/cache" "$KZ" bench --model "openai:$URL:replay" --suite "$WORK/suite" --format triton --samples 3
     --out "$WORK/run" --device cpu --jobs 1 --trials 2)

# First run: kill it once a few verdicts are in.
"${RUN[@]}" > "$WORK/first.log" 2>&1 &
BENCH=$!
for _ in $(seq 600); do
  [[ -f "$WORK/run/results.jsonl" ]] && (( $(wc -l < "$WORK/run/results.jsonl") >= 3 )) && break
  sleep 0.2
done
kill -9 "$BENCH" 2>/dev/null; wait "$BENCH" 2>/dev/null
first_results=$(wc -l < "$WORK/run/results.jsonl")
check "first run was killed part-way ($first_results of 12 verdicts)" test "$first_results" -lt 12
check "first run generated all 12 samples" test "$(stats choices)" -eq 12

# Second run: resumes.
"${RUN[@]}" > "$WORK/second.log" 2>&1
check "resumed run exits 0" test $? -eq 0
check "resumed run generated nothing new" test "$(stats choices)" -eq 12
check "no sample evaluated twice, none missing" python3 - "$WORK/run/results.jsonl" <<'PY'
import json, sys
labels = [json.loads(line)["candidate"] for line in open(sys.argv[1])]
assert len(labels) == 12 and len(set(labels)) == 12, labels
PY
check "summary.json keys pass_at_k by k and fast_p by p, per level" python3 - "$WORK/run/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert set(s["pass_at_k"]) == {"1", "2", "3"}, s["pass_at_k"]
assert set(s["fast_p"]) == {"0", "0.5", "0.8", "1", "1.5", "2"}, s["fast_p"]
assert set(s["levels"]) == {"1", "2"}, s["levels"].keys()
assert all(0 <= v <= 1 for v in s["pass_at_k"].values())
assert s["pass_at_k"]["3"] >= s["pass_at_k"]["1"]
PY
check "statuses mix correct and failing samples" python3 - "$WORK/run/results.jsonl" <<'PY'
import json, sys
statuses = {json.loads(line)["status"] for line in open(sys.argv[1])}
assert "ok" in statuses and len(statuses) >= 2, statuses
PY
check "report.html has the three charts" bash -c "[[ \$(grep -o '<svg' '$WORK/run/report.html' | wc -l) -ge 2 ]] && grep -q 'pass@k' '$WORK/run/report.html'"
check "summary table printed" grep -q "pass@1" "$WORK/second.log"
check "every request was logged" test -s "$WORK/run/requests/requests.jsonl"

# A third run is a pure lookup.
"${RUN[@]}" > "$WORK/third.log" 2>&1
check "third run evaluates nothing" grep -q "generated 0 and evaluated 0 samples" "$WORK/third.log"

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
