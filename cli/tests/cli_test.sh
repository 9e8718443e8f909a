#!/usr/bin/env bash
# End-to-end tests of the `kz` command line on the CPU (registered in cli/CMakeLists.txt).
#
#   bash cli/tests/cli_test.sh PATH/TO/kz [PYTHON]
#
# KZ_SOURCE_DIR must name the source tree (CTest sets it). PYTHON (default: the venv's) is only
# used to parse kz's JSON output. Prints "N passed, M failed"; exits non-zero on any failure.
set -u

KZ=${1:?usage: cli_test.sh PATH/TO/kz [PYTHON]}
SRC=${KZ_SOURCE_DIR:?KZ_SOURCE_DIR must name the source tree}
PY=${2:-$SRC/.venv/bin/python}
[[ -x $KZ ]] || { echo "cli_test: kz binary '$KZ' is not executable"; exit 1; }
[[ -x $PY ]] || PY=python3

REF=$SRC/suite/kzbench/level1/02_relu.py
GOOD=$SRC/suite/examples/triton/02_relu.py
WRONG=$SRC/eval/tests/fixtures/triton_wrong.py
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kz-cli-test.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

passed=0
failed=0
pass() { passed=$((passed + 1)); echo "PASS  $1"; }
fail() {
  failed=$((failed + 1)); echo "FAIL  $1"
  if [[ -n ${2:-} ]]; then sed 's/^/      | /' <<<"$2" | head -40; fi
}

# run NAME CMD...: runs CMD, leaves its exit code in $rc, stdout in $out, stderr in $err.
run() {
  "$@" >"$TMP/stdout" 2>"$TMP/stderr"
  rc=$?
  out=$(cat "$TMP/stdout")
  err=$(cat "$TMP/stderr")
}
show() { printf 'exit %s\n--- stdout\n%s\n--- stderr\n%s\n' "$rc" "$out" "$err"; }

# Checks that stdout is exactly one JSON object with kz eval's verdict keys, and runs the Python
# expression $1 against it (as `v`). Prints the reason on failure.
check_verdict_json() {
  "$PY" - "$1" "$TMP/stdout" <<'PYEOF'
import json, sys
expr, path = sys.argv[1], sys.argv[2]
lines = [line for line in open(path).read().splitlines() if line.strip()]
if len(lines) != 1:
    sys.exit(f"expected one line of JSON on stdout, got {len(lines)}")
v = json.loads(lines[0])
if not isinstance(v, dict):
    sys.exit("stdout is not a JSON object")
missing = {"status", "correct", "compiled", "speedup", "runtime_ms", "ref_runtime_ms", "checks", "message"} - v.keys()
if missing:
    sys.exit(f"missing keys: {sorted(missing)}")
if v["speedup"] is not None or v["runtime_ms"] is not None or v["ref_runtime_ms"] is not None:
    sys.exit("speedup/runtime_ms/ref_runtime_ms must be null on the CPU")
if not isinstance(v["checks"], list):
    sys.exit("checks is not a list")
if not eval(expr, {"v": v}):
    sys.exit(f"condition failed: {expr}  (status={v['status']}, checks={v['checks']})")
PYEOF
}

# ---- kz eval --json ----------------------------------------------------------------------------

run "$KZ" eval "$REF" "$GOOD" --json --trials 2
if [[ $rc -eq 0 ]] && why=$(check_verdict_json 'v["status"] == "ok" and v["correct"] is True and v["compiled"] is True and v["checks"] == []' 2>&1); then
  pass "eval --json: correct candidate -> exit 0, status ok"
else
  fail "eval --json: correct candidate -> exit 0, status ok" "${why:-}"$'\n'"$(show)"
fi

run "$KZ" eval "$REF" "$WRONG" --json --trials 2
if [[ $rc -eq 0 ]] && why=$(check_verdict_json 'v["status"] == "incorrect" and v["correct"] is False and "output_mismatch" in v["checks"]' 2>&1); then
  pass "eval --json: wrong candidate -> exit 0, status incorrect"
else
  fail "eval --json: wrong candidate -> exit 0, status incorrect" "${why:-}"$'\n'"$(show)"
fi

# Human-readable output names the status.
run "$KZ" eval "$REF" "$WRONG" --trials 2
if [[ $rc -eq 0 && $out == *incorrect* && $out == *output_mismatch* ]]; then
  pass "eval (text): wrong candidate -> exit 0, prints incorrect and the check"
else
  fail "eval (text): wrong candidate -> exit 0, prints incorrect and the check" "$(show)"
fi

# ---- usage and infrastructure errors -----------------------------------------------------------

run "$KZ" eval "$REF"
if [[ $rc -eq 2 ]]; then pass "eval with a missing argument -> exit 2"; else fail "eval with a missing argument -> exit 2" "$(show)"; fi

run "$KZ" eval "$REF" "$GOOD" --device bogus
if [[ $rc -eq 2 && $err == *bogus* ]]; then
  pass "eval --device bogus -> exit 2, message names the value"
else
  fail "eval --device bogus -> exit 2, message names the value" "$(show)"
fi

run "$KZ"
if [[ $rc -eq 2 ]]; then pass "kz without a subcommand -> exit 2"; else fail "kz without a subcommand -> exit 2" "$(show)"; fi

run "$KZ" eval "$TMP/no_such_reference.py" "$GOOD" --json
if [[ $rc -ne 0 && $err == *no_such_reference.py* && -z $out ]]; then
  pass "eval with a missing reference file -> non-zero exit, message names it, no JSON"
else
  fail "eval with a missing reference file -> non-zero exit, message names it, no JSON" "$(show)"
fi

# ---- kz eval-suite -----------------------------------------------------------------------------

mkdir -p "$TMP/suite" "$TMP/candidates" "$TMP/out"
for task in 01_add_mul 02_relu 07_softmax; do
  cp "$SRC/suite/kzbench/level1/$task.py" "$TMP/suite/"
  cp "$SRC/suite/examples/triton/$task.py" "$TMP/candidates/"
done
run "$KZ" eval-suite --suite "$TMP/suite" --candidates "$TMP/candidates" --out "$TMP/out/results.jsonl" --trials 2
if [[ $rc -eq 0 ]] && why=$("$PY" - "$TMP/out/results.jsonl" <<'PYEOF' 2>&1
import json, sys
lines = [line for line in open(sys.argv[1]).read().splitlines() if line.strip()]
if len(lines) != 3:
    sys.exit(f"expected 3 lines in results.jsonl, got {len(lines)}")
verdicts = [json.loads(line) for line in lines]
ids = sorted(v["task_id"] for v in verdicts)
if ids != ["01_add_mul", "02_relu", "07_softmax"]:
    sys.exit(f"unexpected task ids {ids}")
bad = [(v["task_id"], v["status"]) for v in verdicts if v["status"] != "ok"]
if bad:
    sys.exit(f"not ok: {bad}")
PYEOF
) && [[ $out == *"pass rate"* ]]; then
  pass "eval-suite: 3 triton examples -> exit 0, 3 ok lines in results.jsonl, summary with pass rate"
else
  fail "eval-suite: 3 triton examples -> exit 0, 3 ok lines in results.jsonl, summary with pass rate" \
       "${why:-}"$'\n'"$(show)"
fi

# ---- kz stays free of libtorch --------------------------------------------------------------------
# generate / serve-model live in kz-engine; kz hands them over, so kz itself starts in milliseconds.
if ldd "$KZ" | grep -q 'libtorch'; then
  fail "kz does not link libtorch (generate and serve-model run in kz-engine)" "$(ldd "$KZ" | grep torch)"
else
  pass "kz does not link libtorch (generate and serve-model run in kz-engine)"
fi
run "$KZ" --help
if [[ $rc == 0 && $out == *"generate"* && $out == *"serve-model"* ]]; then
  pass "kz --help lists generate and serve-model"
else
  fail "kz --help lists generate and serve-model" "$(show)"
fi

# ---- kz config show ----------------------------------------------------------------------------

run "$KZ" config show
if [[ $rc -eq 0 && $out == *"trials = 5"* ]]; then
  pass "config show -> TOML with the default trials = 5"
else
  fail "config show -> TOML with the default trials = 5" "$(show)"
fi

printf 'trials = 3\n[tolerance]\natol_fp32 = "not a number\n' >"$TMP/bad.toml"
run "$KZ" config show --config "$TMP/bad.toml"
if [[ $rc -ne 0 && $err == *bad.toml* ]]; then
  pass "config show --config <bad toml> -> fails, message names the file"
else
  fail "config show --config <bad toml> -> fails, message names the file" "$(show)"
fi

printf 'trials = 7\n' >"$TMP/good.toml"
run "$KZ" config show --config "$TMP/good.toml"
if [[ $rc -eq 0 && $out == *"trials = 7"* ]]; then
  pass "config show --config <good toml> -> the file's value wins"
else
  fail "config show --config <good toml> -> the file's value wins" "$(show)"
fi

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
