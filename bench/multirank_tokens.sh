#!/usr/bin/env bash
# Tokens/s of `zinf train` on 1, 2 and 3 ranks: same model, same global batch, state in memory.
#
# Usage: bench/multirank_tokens.sh [ZINF] (default build/tools/zinf/zinf); environment:
#   MODEL (mini), GLOBAL_BATCH (12: rows per optimizer step over all ranks, divisible by 1, 2, 3),
#   STEPS (10 per run; the first step, which records the trace and creates state, is not counted),
#   ROUNDS (2). Runs are interleaved: 1 2 3, then 3 2 1, ... so every world size sees the same
#   machine; 1 rank runs without mpirun (the local communicator), 2 and 3 under mpirun.
# What --json-log reports: only rank 0 writes it, and its tokens_per_s is rank 0's own tokens of
# the step (its micro-batches, GLOBAL_BATCH / W rows of T tokens) / rank 0's step time. Every
# rank processes as many rows and the step ends in collectives, so the job's tokens/s is
#   W * tokens_per_s = GLOBAL_BATCH * T / step_s,
# which is what the table shows (median over the counted steps of all rounds).
# Last line: tokens_per_s_1=.. tokens_per_s_2=.. tokens_per_s_3=.. ratio_2=.. ratio_3=.. (vs 1 rank).
# On a machine with fewer cores than ranks the ranks share cores: the output says so, and then
# the figures measure the engine's overheads, not scaling. The model's matmuls run in OpenBLAS,
# which by default starts a thread per core in every rank: with OPENBLAS_NUM_THREADS unset one
# rank already uses every core, so set OPENBLAS_NUM_THREADS=1 to compare ranks, not threads.
set -euo pipefail
zinf=${1:-build/tools/zinf/zinf}
model=${MODEL:-mini}
global_batch=${GLOBAL_BATCH:-12}
steps=${STEPS:-10}
rounds=${ROUNDS:-2}
[ -x "$zinf" ] || { echo "multirank_tokens: no zinf executable at $zinf" >&2; exit 1; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/multirank_tokens.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export ZINF_LOG_LEVEL=warning OMPI_MCA_rmaps_base_oversubscribe=1

cat > "$tmp/ds.json" <<JSON
{"train_batch_size": $global_batch, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
 "bf16": {"enabled": true},
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}},
 "zero_optimization": {"stage": 3, "offload_param": {"device": "none"}, "offload_optimizer": {"device": "none"}}}
JSON

run() {  # run NP ROUND
  local np=$1 log="$tmp/np$1_r$2.jsonl"
  local cmd=("$zinf" train --config "$tmp/ds.json" --model "$model" --steps "$steps" --json-log "$log")
  if [ "$np" -gt 1 ]; then
    cmd=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$np" "${cmd[@]}")
  fi
  timeout 900 "${cmd[@]}" > "$tmp/out" 2>&1 || { echo "multirank_tokens: $np ranks failed:"; cat "$tmp/out"; exit 1; }
}

for ((r = 0; r < rounds; ++r)); do
  if ((r % 2 == 0)); then order="1 2 3"; else order="3 2 1"; fi
  for np in $order; do
    run "$np" "$r"
    echo "round $r: $np rank(s) done" >&2
  done
done

python3 - "$tmp" "$model" "$global_batch" "$steps" "$rounds" "$(nproc)" "${OPENBLAS_NUM_THREADS:-}" <<'PY'
import glob, json, statistics, sys
tmp, model, gb, steps, rounds, cores = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
blas = f"OPENBLAS_NUM_THREADS={sys.argv[7]}" if sys.argv[7] else "OpenBLAS threads per rank: default (one per core)"
print(f"multirank_tokens: zinf train --model {model}, global batch {gb} rows, offload none, "
      f"{steps} steps per run (first not counted), {rounds} rounds interleaved, {cores} cores, {blas}")
print("job tok/s = W x rank 0's JSON tokens_per_s = global tokens per step / median step_s")
print(f"{'ranks':>5} {'rows/rank':>9} {'tok/step':>9} {'step_s':>8} {'json tok/s':>10} {'job tok/s':>10} {'vs 1 rank':>9}  note")
job = {}
for np in (1, 2, 3):
    step_s, json_tps, tokens = [], [], None
    for path in sorted(glob.glob(f"{tmp}/np{np}_r*.jsonl")):
        rows = [json.loads(line) for line in open(path)]
        assert len(rows) == steps, (path, len(rows))
        for row in rows[1:]:
            step_s.append(row["step_s"])
            json_tps.append(row["tokens_per_s"])
            tokens = round(row["tokens_per_s"] * row["step_s"]) * np  # rank 0's tokens x W
    s = statistics.median(step_s)
    job[np] = tokens / s
    note = f"oversubscribed: {np} ranks on {cores} cores" if np > cores else ""
    print(f"{np:>5} {gb // np:>9} {tokens:>9} {s:>8.4f} {statistics.median(json_tps):>10.0f} {job[np]:>10.0f} "
          f"{job[np] / job[1]:>9.3f}  {note}")
print(f"tokens_per_s_1={job[1]:.0f} tokens_per_s_2={job[2]:.0f} tokens_per_s_3={job[3]:.0f} "
      f"ratio_2={job[2] / job[1]:.3f} ratio_3={job[3] / job[1]:.3f}")
PY
