#!/usr/bin/env bash
# zinf plan end to end (functional only; bench/plan_accuracy.sh measures speed and accuracy):
#  (a) --json has config, predicted_step_s, predicted_peak_host_bytes, predicted_disk_bytes and
#      candidates, and names which roofs were given or assumed;
#  (b) --write writes a config that `zinf config check` and `zinf train --config` read unchanged,
#      and the trained run's peak RSS is not above the predicted peak host bytes;
#  (c) nothing fits: exit 3, naming what is short and by how much;
#  (d) bad input names the option and the value;
#  (e) zinf train --plan prints the plan, trains with it, and at the end sets the predicted step
#      time and peak host memory beside the measured ones;
#  (f) short of host memory for every candidate as configured but not under the engine's budget
#      sizing: the winner's config carries zinf.host_memory_budget, zinf train runs it within that
#      budget, and zinf train --plan accepts the budget it planned;
#  (g) zinf train refuses, before any work, a run whose predicted host memory is far above what
#      the machine has (exit 1, the shortfall, the largest terms and what to change named);
#  (h) a plan for a GPU described by --gpu-name and --gpu-memory (a build with the GPU layer; no
#      GPU needed): every candidate computes on it with its GPU bytes, a roomy GPU keeps the whole
#      state, a small one drops those candidates and names its shortfall, an unknown GPU asks for
#      its peak, and --device cpu refuses the GPU options.
# Usage: plan_cli_test.sh ZINF
set -euo pipefail
zinf=$1
tmp=$(mktemp -d "${ZINF_TEST_TMPDIR:-/tmp}/plan_cli.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export ZINF_LOG_LEVEL=warning
model=(--model small --layers 2 --hidden 64 --heads 2 --seq 64 --vocab 256)
roofs=(--matmul-gflops 40 --memory-gbps 20 --device cpu)
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

# --predict: the winner's own config is predicted as the winner; a config that does not fit says why.
"$zinf" plan "${model[@]}" "${roofs[@]}" --train-batch 4 --nvme-path "$tmp/nvme" --predict "$tmp/ds.json" --json \
  > "$tmp/predict.json"
python3 - "$tmp/predict.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
p = j["predicted_config"]
assert p["fits"] and abs(p["predicted_step_s"] - j["predicted_step_s"]) <= 1e-9 * j["predicted_step_s"], (p, j["predicted_step_s"])
assert p["predicted_peak_host_bytes"] == j["predicted_peak_host_bytes"]
PY
"$zinf" plan "${model[@]}" "${roofs[@]}" --train-batch 4 --host-memory 1G --predict "$tmp/ds.json" > "$tmp/predict.txt"
grep -q -- "^--predict $tmp/ds.json: .* s/step .*x the plan's #1. It fits." "$tmp/predict.txt" \
  || { cat "$tmp/predict.txt"; echo "no --predict line"; exit 1; }
"$zinf" plan "${model[@]}" "${roofs[@]}" --train-batch 4 --host-memory 1G --host-fraction 0.05 --predict "$tmp/ds.json" \
  > "$tmp/predict_small.txt" 2>&1 || true
grep -q -- "^--predict .*It does not fit: host memory" "$tmp/predict_small.txt" \
  || { cat "$tmp/predict_small.txt"; echo "no shortfall on the --predict line"; exit 1; }

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
grep -q "^plan: predicted .* s/step, measured .* (median of 1; predicted / measured .*); peak host predicted" "$tmp/train_plan.out" \
  || { cat "$tmp/train_plan.out"; echo "no planned-against-measured line"; exit 1; }
grep -q "^done: 2 steps" "$tmp/train_plan.out"
# (f) a budget. A model whose pools, gathers and weight copies outweigh the budget's process term.
wide=(--model small --layers 4 --hidden 512 --heads 4 --seq 16 --vocab 8192)
"$zinf" plan "${wide[@]}" "${roofs[@]}" --train-batch 4 --nvme-path "$tmp/nvme" --host-memory 64G --json > "$tmp/roomy.json"
host=$(python3 - "$tmp/roomy.json" <<'PY'
import json, sys
c = [c for c in json.load(open(sys.argv[1]))["candidates"] if c["fits"]]
least = min(x["least_host_memory_budget"] for x in c)
smallest = min(x["predicted_peak_host_bytes"] for x in c)
assert all(x["host_memory_budget"] == 0 for x in c), "a budget where everything fits"
assert least < smallest, (least, smallest)
print(int((least + (smallest - least) / 2) / 0.9) + 1)
PY
)
"$zinf" plan "${wide[@]}" "${roofs[@]}" --train-batch 4 --nvme-path "$tmp/nvme" --host-memory "$host" --json > "$tmp/budget.json"
"$zinf" plan "${wide[@]}" "${roofs[@]}" --train-batch 4 --nvme-path "$tmp/nvme" --host-memory "$host" --write "$tmp/ds_budget.json" > /dev/null
"$zinf" train --config "$tmp/ds_budget.json" "${wide[@]}" --steps 2 --json-log "$tmp/budget.jsonl" > "$tmp/budget_train.out"
python3 - "$tmp/budget.json" "$tmp/ds_budget.json" "$tmp/budget.jsonl" <<'PY'
import json, sys
plan, ds = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
budget = ds["zinf"]["host_memory_budget"]
assert budget == plan["config"]["zinf"]["host_memory_budget"] > 0, (ds.get("zinf"), plan["config"].get("zinf"))
assert plan["predicted_peak_host_bytes"] <= budget
assert ds["zero_optimization"]["stage3_max_live_parameters"] == plan["candidates"][0]["stage3_max_live_parameters"]
rss = max(json.loads(l)["peak_rss_bytes"] for l in open(sys.argv[3]))
assert rss <= budget, f"peak RSS {rss} above the planned budget {budget}"
PY
grep -q "^host memory budget " "$tmp/budget_train.out"
"$zinf" train --plan "${wide[@]}" "${roofs[@]}" --train-batch 4 --nvme-path "$tmp/nvme" --host-memory "$host" --steps 1 \
  > "$tmp/budget_plan.out"
grep -q "^plan: training with #1" "$tmp/budget_plan.out"
grep -q "^done: 1 steps" "$tmp/budget_plan.out"
# (g): about 160e9 parameters, 2.9 TB of host state in memory: no machine that runs this has it.
avail_kib=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo)
if [ -n "$avail_kib" ] && [ "$avail_kib" -lt $((2 * 1024 * 1024 * 1024)) ]; then
  set +e
  "$zinf" train --model small --layers 200 --hidden 8192 --heads 64 --seq 64 --steps 1 \
    > "$tmp/huge.out" 2> "$tmp/huge.err"
  rc=$?
  set -e
  [ "$rc" -eq 1 ] || { cat "$tmp/huge.err"; echo "FAIL: a run far above the host memory: exit $rc, not 1"; exit 1; }
  grep -q "GiB short" "$tmp/huge.err" || { cat "$tmp/huge.err"; echo "FAIL: no shortfall named"; exit 1; }
  grep -q -- "--no-memory-check" "$tmp/huge.err" || { cat "$tmp/huge.err"; echo "FAIL: no way past named"; exit 1; }
  grep -q "GiB of host memory (largest: " "$tmp/huge.err" || { cat "$tmp/huge.err"; echo "FAIL: no term named"; exit 1; }
fi
# (h)
gpu=(--matmul-gflops 40 --memory-gbps 20 --device cuda --gpu-name "NVIDIA H100 80GB HBM3" --train-batch 4)
if "$zinf" plan "${model[@]}" "${gpu[@]}" --gpu-memory 79G --json > "$tmp/gpu.json" 2> "$tmp/gpu.err"; then
  python3 - "$tmp/gpu.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["compute"] == "cuda", j["compute"]
assert all(c["compute"] == "cuda" and c["predicted_gpu_bytes"] > 0 for c in j["candidates"]), "a candidate off the GPU"
z = j["config"]["zero_optimization"]
assert z["offload_param"]["device"] == "none" and z["offload_optimizer"]["device"] == "none", z
assert 0 < j["predicted_gpu_bytes"] < 79 << 30
g = j["machine"]["compute_gpu"]
assert g["tflops"]["value"] == 989 and "datasheet" in g["tflops"]["source"], g
assert any("GPU time-model constants" in a for a in j["assumptions"]), j["assumptions"]
PY
  "$zinf" plan "${model[@]}" "${gpu[@]}" --gpu-memory 79G > "$tmp/gpu.txt"
  grep -q "computing on: NVIDIA H100 80GB HBM3, 79.00 GiB" "$tmp/gpu.txt"
  grep -q "GPU GiB" "$tmp/gpu.txt"
  rc=0
  "$zinf" plan "${model[@]}" "${gpu[@]}" --gpu-memory 64K > "$tmp/gpu_small.out" 2> "$tmp/gpu_small.err" || rc=$?
  [ "$rc" = 3 ] && grep -q "more GPU memory" "$tmp/gpu_small.err" \
    || { echo "a GPU too small: exit $rc"; cat "$tmp/gpu_small.out" "$tmp/gpu_small.err"; exit 1; }
  rc=0
  "$zinf" plan "${model[@]}" --device cuda --gpu-name "Mystery GPU" --gpu-memory 16G 2> "$tmp/gpu_unknown.err" || rc=$?
  [ "$rc" = 2 ] && grep -q -- "--gpu-tflops" "$tmp/gpu_unknown.err" \
    || { echo "an unknown GPU: exit $rc"; cat "$tmp/gpu_unknown.err"; exit 1; }
elif grep -q "built without the GPU layer" "$tmp/gpu.err"; then
  echo "plan_cli: (h) skipped: this zinf was built without the GPU layer"
else
  cat "$tmp/gpu.err"
  exit 1
fi
rc=0
"$zinf" plan "${model[@]}" --device cpu --gpu-memory 16G 2> "$tmp/cpu_gpu.err" || rc=$?
[ "$rc" = 2 ] && grep -q -- "--device cpu" "$tmp/cpu_gpu.err" || { echo "--device cpu --gpu-memory: exit $rc"; cat "$tmp/cpu_gpu.err"; exit 1; }
echo "plan_cli: ok"
