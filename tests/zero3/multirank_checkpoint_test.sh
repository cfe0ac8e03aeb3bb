#!/usr/bin/env bash
# Checkpoints across world sizes, with the same global batch (train_batch_size 12, no gradient
# accumulation) so that every world size does the same math up to float summation order:
#  (a) 10 steps on 1 rank and on 2 ranks, each saved and consolidated to safetensors: the same
#      tensor names and shapes, and the same weights within a tolerance (below);
#  (b) the 2-rank checkpoint resumed on 3 ranks to step 16 (and on 1 rank to step 12): it says
#      'resumed from', continues at step 11 with finite, falling losses, and matches the same
#      checkpoint resumed on 2 ranks within the multi-rank loss tolerance.
# Tolerances. Losses: 2e-5 relative, as in multirank_train_test.sh (each rank sums its own rows
# first, so float sums run in another order; a wrong partition, a missing 1/W or rows from the
# wrong data position give > 1e-2). Weights: the same summation-order differences reach the
# weights through Adam, whose update is lr * m / (sqrt(v) + eps) and so can amplify a tiny
# gradient difference on an element whose gradient is near zero, up to one opposite step of lr
# (2e-3) each way: the largest difference is held to 2 lr = 4e-3, and the mean to 3e-6, ten
# times the 2.9e-7 measured (largest 1.4e-5 measured, 2026-11-23). A consolidation that
# misplaces slices, or a rank's state that is lost, moves whole tensors by the weights' own size
# (~2e-2), far above both.
set -euo pipefail
zinf=$1
tmp=$(mktemp -d "${ZINF_TEST_TMPDIR:-/tmp}/multirank_ckpt.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export ZINF_LOG_LEVEL=warning
# These tolerances are for splitting the global batch over ranks with fp32 products: pin the
# linear layers to OpenBLAS fp32 (bf16 products round inputs, and their summation order
# differs with the rows per rank a little more; tests/model/matmul_test.cpp covers them).
export ZINF_MATMUL=fp32
mpirun=(timeout 300 mpirun --allow-run-as-root --oversubscribe --bind-to none)
cat > "$tmp/ds.json" <<JSON
{"train_batch_size": 12, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
 "bf16": {"enabled": true},
 "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.01}},
 "zero_optimization": {"stage": 3, "sub_group_size": 50000, "reduce_bucket_size": 20000}}
JSON
train=("$zinf" train --config "$tmp/ds.json" --model tiny)

# run NAME NP ARGS...: zinf train on NP ranks, output in $tmp/NAME.out, losses in $tmp/NAME.jsonl.
run() {
  local name=$1 np=$2
  shift 2
  local start
  start=$(date +%s)
  if [ "$np" -eq 1 ]; then
    "${train[@]}" --json-log "$tmp/$name.jsonl" "$@" > "$tmp/$name.out" 2>&1 \
      || { echo "$name (1 rank) failed:"; cat "$tmp/$name.out"; exit 1; }
  else
    "${mpirun[@]}" -np "$np" "${train[@]}" --json-log "$tmp/$name.jsonl" "$@" > "$tmp/$name.out" 2>&1 \
      || { echo "$name ($np ranks) failed:"; cat "$tmp/$name.out"; exit 1; }
  fi
  echo "$name: $np rank(s), $(( $(date +%s) - start )) s"
}

# (a) The same 10 steps on 1 and 2 ranks give the same weights.
run w1 1 --steps 10 --save "$tmp/A"
run w2 2 --steps 10 --save "$tmp/B"
"$zinf" consolidate "$tmp/A" "$tmp/A.safetensors" > /dev/null
"$zinf" consolidate "$tmp/B" "$tmp/B.safetensors" > /dev/null
python3 - "$tmp/A.safetensors" "$tmp/B.safetensors" <<'PY'
import json, math, struct, sys

def read(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    tensors = {}
    for name, t in header.items():
        assert t["dtype"] == "F32", (path, name, t["dtype"])
        lo, hi = t["data_offsets"]
        values = struct.unpack(f"<{(hi - lo) // 4}f", data[lo:hi])
        assert len(values) == math.prod(t["shape"]), (path, name)
        tensors[name] = (t["shape"], values)
    return tensors

a, b = read(sys.argv[1]), read(sys.argv[2])
assert sorted(a) == sorted(b), f"tensor names differ: {sorted(set(a) ^ set(b))}"
worst, total, count = 0.0, 0.0, 0
for name in sorted(a):
    (sa, va), (sb, vb) = a[name], b[name]
    assert sa == sb, f"{name}: shape {sa} on 1 rank, {sb} on 2"
    assert all(math.isfinite(x) for x in vb), f"{name}: non-finite weights on 2 ranks"
    diffs = [abs(x - y) for x, y in zip(va, vb)]
    worst = max(worst, max(diffs))
    total += sum(diffs)
    count += len(diffs)
mean = total / count
print(f"(a) {len(a)} tensors, {count} weights: 1 rank against 2 ranks after 10 steps: "
      f"largest difference {worst:.2e}, mean {mean:.2e}")
assert worst < 4e-3, f"weights differ by up to {worst:.2e}"
assert mean < 3e-6, f"weights differ by {mean:.2e} on average"
PY

# (b) Resume the 2-rank checkpoint on 2 ranks (the reference), 3 ranks and 1 rank.
run r2 2 --steps 16 --resume "$tmp/B"
run r3 3 --steps 16 --resume "$tmp/B"
run r1 1 --steps 12 --resume "$tmp/B"
for name in r2 r3 r1; do
  grep -q "resumed from $tmp/B at step 10" "$tmp/$name.out" || { echo "$name did not resume:"; cat "$tmp/$name.out"; exit 1; }
done
python3 - "$tmp/w2.jsonl" "$tmp/r2.jsonl" "$tmp/r3.jsonl" "$tmp/r1.jsonl" <<'PY'
import json, math, sys
original, r2, r3, r1 = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
assert [r["step"] for r in r2] == list(range(11, 17)), r2
assert [r["step"] for r in r3] == list(range(11, 17)), r3
assert [r["step"] for r in r1] == [11, 12], r1
for name, rows in (("3 ranks", r3), ("1 rank", r1)):
    losses = [r["loss"] for r in rows]
    assert all(math.isfinite(x) for x in losses), (name, losses)
    worst = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(rows, r2))
    print(f"(b) resumed on {name}: losses {[round(x, 5) for x in losses]}, "
          f"worst relative difference from 2 ranks {worst:.2e}")
    assert worst < 2e-5, f"resumed on {name}: losses differ from the 2-rank resume by {worst:.2e}"
assert r3[-1]["loss"] < original[0]["loss"], (r3[-1]["loss"], original[0]["loss"])
PY
echo "multirank_checkpoint_test: checkpoints carry across 1, 2 and 3 ranks"
