#!/usr/bin/env bash
# Two `zinf train` runs given the same nvme_path: the second is refused at once with a message
# naming the swap folder and the first run's pid, and the first goes on and succeeds.
# The first run is held after it opened its swap stores, without any timing: its --json-log is
# a FIFO, whose open blocks until this script starts reading it.
set -euo pipefail
zinf=$1
tmp=$(mktemp -d "${ZINF_TEST_TMPDIR:-/tmp}/swaplock.XXXXXX")
first=""
cleanup() {
  if [ -n "$first" ]; then kill "$first" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
export ZINF_LOG_LEVEL=warning
mkdir -p "$tmp/nvme"
cat > "$tmp/ds.json" <<JSON
{"train_batch_size": 4, "gradient_accumulation_steps": 1, "bf16": {"enabled": true},
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
 "zero_optimization": {"stage": 3, "sub_group_size": 50000,
   "offload_param": {"device": "nvme", "nvme_path": "$tmp/nvme"},
   "offload_optimizer": {"device": "nvme", "nvme_path": "$tmp/nvme"}}}
JSON
mkfifo "$tmp/log.fifo"
"$zinf" train --config "$tmp/ds.json" --model tiny --steps 3 --json-log "$tmp/log.fifo" > "$tmp/out1" 2>&1 &
first=$!
# Wait (no deadline but the test's own) until the first run holds its swap folders.
lock="$tmp/nvme/zinf_swap/rank0/optimizer/zinf.lock"
until [ -f "$lock" ] && [ "$(cat "$lock")" = "$first" ]; do
  if ! kill -0 "$first" 2>/dev/null; then echo "the first run ended early:"; cat "$tmp/out1"; exit 1; fi
  sleep 0.1
done
if "$zinf" train --config "$tmp/ds.json" --model tiny --steps 3 > "$tmp/out2" 2>&1; then
  echo "the second run on the same nvme_path was not refused:"; cat "$tmp/out2"; exit 1
fi
if ! grep -q "swap folder $tmp/nvme/zinf_swap/rank0/.* is in use by another zinf process (pid $first" "$tmp/out2"; then
  echo "the second run failed without naming the folder and pid $first:"; cat "$tmp/out2"; exit 1
fi
echo "second run refused: $(grep -m1 'in use' "$tmp/out2")"
# Let the first run go on: read its log.
cat "$tmp/log.fifo" > "$tmp/log.jsonl" &
reader=$!
status=0
wait "$first" || status=$?
first=""
wait "$reader" || true
if [ "$status" -ne 0 ]; then echo "the first run failed ($status):"; cat "$tmp/out1"; exit 1; fi
lines=$(wc -l < "$tmp/log.jsonl")
if [ "$lines" -ne 3 ]; then echo "the first run logged $lines steps, not 3"; cat "$tmp/out1"; exit 1; fi
echo "first run: 3 steps, exit 0"
