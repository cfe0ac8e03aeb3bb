#!/usr/bin/env bash
# `zinf train` checks what it will write before step 1, and stops cleanly on SIGINT/SIGTERM:
#  - a --save or --json-log that cannot be created fails before any step is trained;
#  - a --host-memory-budget below what the run needs fails before any step and any swap file;
#  - a --resume whose `latest` leaves the folder, or names no folder, is refused;
#  - SIGTERM (SIGINT) stops after the current step, saves, removes the built-in config's
#    temporary NVMe folder and exits 143 (130); resuming reproduces an uninterrupted run;
#  - a second signal exits at once, and `latest` still loads.
# Signals are sent once a save has announced itself (ZINF_TEST_SLOW_SAVE_MS=0, test only), so
# no timing is involved.
set -euo pipefail
zinf=$1
tmp=$(mktemp -d "${ZINF_TEST_TMPDIR:-/tmp}/failfirst.XXXXXX")
pid=""
cleanup() {
  if [ -n "$pid" ]; then kill -9 "$pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
export ZINF_LOG_LEVEL=warning
export TMPDIR=$tmp/scratch
mkdir "$TMPDIR"
args=(train --model tiny --seed 5)
fail() { echo "FAIL: $*"; exit 1; }

# (1) Outputs that cannot be written fail before step 1 (a regular file where a folder must be).
touch "$tmp/file"
for bad in "--save $tmp/file/ck" "--json-log $tmp/file/log.jsonl"; do
  status=0
  # shellcheck disable=SC2086
  "$zinf" "${args[@]}" --steps 3 $bad > "$tmp/out" 2>&1 || status=$?
  [ "$status" -ne 0 ] || fail "$bad was accepted"
  grep -q -- "${bad%% *}" "$tmp/out" || fail "$bad: the error does not name the option: $(cat "$tmp/out")"
  if grep -q "^step " "$tmp/out"; then fail "$bad: steps were trained before the error"; fi
  echo "refused before step 1: $bad ($(tail -1 "$tmp/out"))"
done
# A host memory budget below what the run needs is refused before step 1 and before any swap
# file, naming the budget and the least; a malformed size names the option.
status=0
"$zinf" "${args[@]}" --steps 2 --host-memory-budget 10M > "$tmp/out" 2>&1 || status=$?
[ "$status" -eq 1 ] || fail "--host-memory-budget 10M: exit $status: $(cat "$tmp/out")"
grep -q "host memory budget 10.0 MiB is below the .* this run needs" "$tmp/out" || fail "budget refusal: $(cat "$tmp/out")"
if grep -q "^step " "$tmp/out"; then fail "--host-memory-budget 10M: steps were trained before the error"; fi
[ -z "$(find "$TMPDIR" -name '*.swp' 2>/dev/null)" ] || fail "swap files were made before the budget refusal"
status=0
"$zinf" "${args[@]}" --steps 2 --host-memory-budget lots > "$tmp/out" 2>&1 || status=$?
[ "$status" -eq 2 ] && grep -q -- "--host-memory-budget" "$tmp/out" || fail "--host-memory-budget lots: exit $status: $(cat "$tmp/out")"
"$zinf" "${args[@]}" --steps 2 --host-memory-budget 2GiB > "$tmp/out" 2>&1 || { cat "$tmp/out"; fail "a 2 GiB budget"; }
grep -q "^host memory budget 2.0 GiB: " "$tmp/out" || fail "no budget line: $(cat "$tmp/out")"
echo "host memory budget: 10M refused before step 1, 2GiB trained"

# A --save folder that does not exist yet is created private.
"$zinf" "${args[@]}" --steps 2 --save "$tmp/new/ck" > "$tmp/out" 2>&1 || { cat "$tmp/out"; fail "--save into a new folder"; }
[ "$(stat -c %a "$tmp/new/ck")" = 700 ] || fail "--save folder mode $(stat -c %a "$tmp/new/ck")"
[ ! -e "$tmp/new/ck/.zinf_probe" ] && ! ls -a "$tmp/new/ck" | grep -q probe || fail "the probe file was left"

# (2) `latest` must name a plain folder inside the checkpoint folder.
mkdir -p "$tmp/outside/global_step2"
for tag in "../outside/global_step2" "/etc" ".." "global_step9"; do
  cp -r "$tmp/new/ck" "$tmp/badlatest"
  echo "$tag" > "$tmp/badlatest/latest"
  status=0
  "$zinf" "${args[@]}" --steps 4 --resume "$tmp/badlatest" > "$tmp/out" 2>&1 || status=$?
  [ "$status" -ne 0 ] || fail "latest '$tag' was accepted"
  grep -q "$tmp/badlatest/latest" "$tmp/out" || fail "latest '$tag': $(cat "$tmp/out")"
  rm -rf "$tmp/badlatest"
done
echo "latest naming ../, /etc, .. or a missing folder: refused"

# (3) One SIGTERM (or SIGINT): stop after the step, save, clean up, 128 + signal.
"$zinf" "${args[@]}" --steps 8 --json-log "$tmp/ref.jsonl" > "$tmp/ref.out" 2>&1 || { cat "$tmp/ref.out"; fail "reference run"; }
wait_for_save() {  # until the running zinf has announced a save phase
  until grep -q "zinf-test: save" "$tmp/sig.err" 2>/dev/null; do
    kill -0 "$pid" 2>/dev/null || { cat "$tmp/sig.out" "$tmp/sig.err"; fail "the run ended before its first save"; }
    sleep 0.05
  done
}
for sig in TERM INT; do
  want=$([ $sig = TERM ] && echo 143 || echo 130)
  rm -rf "$tmp/ck" "$tmp/sig.jsonl" "$tmp/sig.err"
  ZINF_TEST_SLOW_SAVE_MS=0 "$zinf" "${args[@]}" --steps 8 --save "$tmp/ck" --save-interval 3 \
    --json-log "$tmp/sig.jsonl" > "$tmp/sig.out" 2> "$tmp/sig.err" &
  pid=$!
  wait_for_save
  kill -$sig "$pid"
  status=0
  wait "$pid" || status=$?
  pid=""
  [ "$status" -eq "$want" ] || { cat "$tmp/sig.out" "$tmp/sig.err"; fail "SIG$sig: exit status $status, not $want"; }
  line=$(grep "stopped by SIG$sig after step" "$tmp/sig.out") || { cat "$tmp/sig.out"; fail "SIG$sig: no 'stopped by' line"; }
  step=$(sed -E 's/.*after step ([0-9]+) .*/\1/' <<< "$line")
  [ "$(cat "$tmp/ck/latest")" = "global_step$step" ] || fail "SIG$sig: latest is $(cat "$tmp/ck/latest"), stopped after $step"
  [ -z "$(ls -A "$TMPDIR")" ] || fail "SIG$sig: temporary files left: $(ls -A "$TMPDIR")"
  "$zinf" "${args[@]}" --steps 8 --resume "$tmp/ck" --json-log "$tmp/sig.jsonl" > "$tmp/out" 2>&1 || { cat "$tmp/out"; fail "resume"; }
  python3 - "$tmp/ref.jsonl" "$tmp/sig.jsonl" <<'PY' || fail "SIG$sig: the resumed run differs"
import json, sys
ref = {j["step"]: j["loss"] for j in map(json.loads, open(sys.argv[1]))}
got = [json.loads(l) for l in open(sys.argv[2])]
assert sorted(j["step"] for j in got) == sorted(ref), [j["step"] for j in got]
assert all(j["loss"] == ref[j["step"]] for j in got)
PY
  echo "SIG$sig: $line; exit $status; no temporary files; the resumed run is bit-identical"
done

# (4) A second signal exits at once; what was saved still loads.
rm -rf "$tmp/ck" "$tmp/sig.err"
ZINF_TEST_SLOW_SAVE_MS=300 "$zinf" "${args[@]}" --steps 8 --save "$tmp/ck" --save-interval 1 \
  > "$tmp/sig.out" 2> "$tmp/sig.err" &
pid=$!
wait_for_save
kill -INT "$pid"
until grep -q "stopping at the end of this step" "$tmp/sig.err"; do
  kill -0 "$pid" 2>/dev/null || fail "the run ended without acknowledging SIGINT"
  sleep 0.05
done
kill -INT "$pid"
status=0
wait "$pid" || status=$?
pid=""
[ "$status" -eq 130 ] || fail "second SIGINT: exit status $status"
if grep -q "stopped by" "$tmp/sig.out"; then fail "the second SIGINT did not exit at once"; fi
if [ -f "$tmp/ck/latest" ]; then
  "$zinf" "${args[@]}" --steps 8 --resume "$tmp/ck" > "$tmp/out" 2>&1 || { cat "$tmp/out"; fail "resume after two SIGINTs"; }
fi
echo "second SIGINT: exit 130 at once; the checkpoint folder still resumes"
