#!/usr/bin/env bash
# zinf plan end to end (functional only; bench/plan_accuracy.sh measures speed and accuracy):
#  (a) --json has config, predicted_step_s, predicted_peak_host_bytes, predicted_disk_bytes and
#      candidates, and names which roofs were given or assumed;
#  (b) --write writes a config that `zinf config check` and `zinf train --config` read unchanged,
#      and the trained run's peak RSS is not above the predicted peak host bytes;
#  (c) nothing fits: exit 3, naming what is short and by how much;
#  (d) bad input names the option and the value;
#  (e) zinf train --plan prints the plan, then trains with it.
# Usage: plan_cli_test.sh ZINF
set -euo pipefail
zinf=$1
tmp=$(mktemp -d "${ZINF_TEST_TMPDIR:-/tmp}/plan_cli.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export ZINF_LOG_LEVEL=warning
model=(--model small --layers 2 --hidden 64 --heads 2 --seq 64 --vocab 256)
roofs=(--matmul-gflops 40 --memory-gbps 20)
mkdir -p "$tmp/nvme"

# (a)
"$zinf" plan "${model[@]}" "${roofs[@]}" --train-batch 4 --nvme-path "$tmp/nvme" --json > "$tmp/plan.json"
python3 - "$tmp/plan.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
for k in ("config", "predicted_step_s", "predicted_peak_host_bytes", "predicted_disk_bytes", "candidates"):
    assert k in j, k
assert j["config"]["train_batch_size"] == 4, j["config"]
assert j["predicted_step_s"] > 0 and j["predicted_peak_host_bytes"] > 0
assert len(j["candidates"]) > 1
assert any("given (--matmul-gflops)" in a for a in j["assumptions"]), j["assumptions"]
assert any("assumed" in a for a in j["assumptions"]), j["assumptions"]
devices = {(c["offload_param"], c["offload_optimizer"]) for c in j["candidates"]}
assert ("nvme", "nvme") in devices and ("cpu", "cpu") in devices, devices
PY

# (b) the written config runs unchanged; its peak RSS stays within the prediction.
"$zinf" plan "${model[@]}" "${roofs[@]}" --train-batch 4 --nvme-path "$tmp/nvme" --write "$tmp/ds.json" > "$tmp/plan.txt"
grep -q "wrote $tmp/ds.json" "$tmp/plan.txt"
grep -q "why: " "$tmp/plan.txt"
"$zinf" config check "$tmp/ds.json" "${model[@]}" > /dev/null
"$zinf" train --config "$tmp/ds.json" "${model[@]}" --steps 3 --json-log "$tmp/log.jsonl" > "$tmp/train.out"
python3 - "$tmp/plan.json" "$tmp/log.jsonl" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
rss = max(json.loads(l)["peak_rss_bytes"] for l in open(sys.argv[2]))
pred = plan["predicted_peak_host_bytes"]
assert rss <= pred, f"peak RSS {rss} above the predicted {pred}"
PY

# (c) nothing fits.
rc=0
"$zinf" plan "${model[@]}" "${roofs[@]}" --host-memory 1M > "$tmp/none.out" 2> "$tmp/none.err" || rc=$?
[ "$rc" = 3 ] || { echo "nothing fits: exit $rc, expected 3"; cat "$tmp/none.out" "$tmp/none.err"; exit 1; }
grep -q "nothing fits" "$tmp/none.err"
grep -q "host memory: needs" "$tmp/none.err"
grep -q "short" "$tmp/none.err"

# (d) bad input.
rc=0
"$zinf" plan "${model[@]}" "${roofs[@]}" --host-memory lots 2> "$tmp/bad.err" || rc=$?
[ "$rc" = 2 ] && grep -q -- '--host-memory: .*"lots"' "$tmp/bad.err" || { echo "bad --host-memory: exit $rc"; cat "$tmp/bad.err"; exit 1; }
rc=0
"$zinf" plan "${model[@]}" "${roofs[@]}" --aio-summary "$tmp/missing.json" 2> "$tmp/bad2.err" || rc=$?
[ "$rc" != 0 ] && grep -q "missing.json" "$tmp/bad2.err" || { echo "missing --aio-summary: exit $rc"; cat "$tmp/bad2.err"; exit 1; }

# (e) train --plan.
"$zinf" train --plan "${model[@]}" "${roofs[@]}" --train-batch 4 --steps 2 > "$tmp/train_plan.out"
grep -q "^plan: training with #1" "$tmp/train_plan.out"
grep -q "^done: 2 steps" "$tmp/train_plan.out"
echo "plan_cli: ok"
