#!/usr/bin/env bash
# SIGKILL at seeded random points of `zinf train` (in a checkpoint save or in a training step):
# after each kill the run is resumed from its `latest` until it reaches --steps, and every step
# any segment logged must have the loss of an uninterrupted run, bit for bit. Every `latest`
# left by a kill is loaded by a later segment (the last one loads the final one), so a
# checkpoint that does not load fails the test. Saves announce their phases on stderr and pause
# there (ZINF_TEST_SLOW_SAVE_MS, test only) so that kills land inside saves too.
# Usage: kill_test.sh ZINF [KILLS] [SEED]; prints the tally for docs/reliability.md.
set -euo pipefail
zinf=$1
kills_wanted=${2:-50}
RANDOM=${3:-20240611}
tmp=$(mktemp -d "${ZINF_TEST_TMPDIR:-/tmp}/killtest.XXXXXX")
pid=""
cleanup() {
  if [ -n "$pid" ]; then kill -9 "$pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
export ZINF_LOG_LEVEL=warning
export TMPDIR=$tmp  # the built-in config's NVMe folders: a killed run cannot remove its own
steps=10
args=(train --model tiny --steps "$steps" --seed 5)

"$zinf" "${args[@]}" --json-log "$tmp/ref.jsonl" > "$tmp/ref.out" 2>&1 || { cat "$tmp/ref.out"; exit 1; }

kills=0 in_save=0 in_step=0 chains=0 segments=0
while [ "$kills" -lt "$kills_wanted" ]; do
  chains=$((chains + 1))
  ck=$tmp/ck$chains
  log=$tmp/chain$chains.jsonl
  while :; do
    segments=$((segments + 1))
    resume=()
    if [ -f "$ck/latest" ]; then resume=(--resume "$ck"); fi
    ZINF_TEST_SLOW_SAVE_MS=40 "$zinf" "${args[@]}" "${resume[@]}" --save "$ck" --save-interval 1 \
      --json-log "$log" > "$tmp/seg.out" 2> "$tmp/seg.err" &
    pid=$!
    # A seeded delay of 0.10 to 1.60 s.
    sleep "$(printf '%d.%02d' $(( (RANDOM % 151 + 10) / 100 )) $(( (RANDOM % 151 + 10) % 100 )))"
    if kill -9 "$pid" 2>/dev/null; then
      status=0
      wait "$pid" || status=$?
      pid=""
      if [ "$status" -ne 137 ]; then
        # It ended on its own just before the kill.
        [ "$status" -eq 0 ] || { echo "segment $segments failed ($status):"; cat "$tmp/seg.out" "$tmp/seg.err"; exit 1; }
        break
      fi
      kills=$((kills + 1))
      phase=$(grep -o 'save: .*' "$tmp/seg.err" | tail -1 || true)
      if [ -n "$phase" ] && [ "$phase" != "save: latest written" ]; then in_save=$((in_save + 1)); else in_step=$((in_step + 1)); fi
      continue
    fi
    status=0
    wait "$pid" || status=$?
    pid=""
    [ "$status" -eq 0 ] || { echo "segment $segments failed ($status):"; cat "$tmp/seg.out" "$tmp/seg.err"; exit 1; }
    break
  done
  # The chain reached --steps: its last save is `latest`, nothing temporary is left.
  [ "$(cat "$ck/latest")" = "global_step$steps" ] || { echo "chain $chains: latest is $(cat "$ck/latest")"; exit 1; }
  if ls -a "$ck" | grep -q -e '\.tmp' -e '\.old$'; then echo "chain $chains left temporaries:"; ls -a "$ck"; exit 1; fi
  python3 - "$tmp/ref.jsonl" "$log" "$chains" <<'PY'
import json, sys
ref = {j["step"]: j["loss"] for j in map(json.loads, open(sys.argv[1]))}
seen = []
for line in open(sys.argv[2]):
    try:  # a line a kill cut in two is joined to the next segment's first: skip it
        seen.append(json.loads(line))
    except json.JSONDecodeError:
        pass
bad = [(j["step"], j["loss"], ref[j["step"]]) for j in seen if j["loss"] != ref[j["step"]]]
if bad:
    sys.exit(f"chain {sys.argv[3]}: steps trained with other losses than the uninterrupted run: {bad}")
if sorted({j["step"] for j in seen}) != sorted(ref):
    sys.exit(f"chain {sys.argv[3]}: steps logged {sorted({j['step'] for j in seen})}")
PY
  rm -rf "$ck"
done
echo "SIGKILL: $kills kills ($in_save inside a save, $in_step in training or start-up) over $chains runs of" \
  "$steps steps ($segments processes); every checkpoint loaded, lost 0, every logged loss bit-identical"
