#!/usr/bin/env bash
# zinf train --resume continues the saved run when the user repeats only --resume and --steps
# (with the same --config and model flags): the checkpoint carries the seed, the data and the
# batch geometry. Usage: resume_test.sh ZINF NP (NP = 1, or 2 under mpirun).
#  (a) For offload none, cpu and nvme: 8 steps straight (--seed 3 --data d.txt, saving every 4)
#      against 4 steps, then a resume to 8 with neither --seed nor --data: the same losses,
#      learning rates and gradient norms bit for bit, the same consolidated weights, per-rank
#      optimizer state files (byte for byte) and engine.json (apart from the data's description,
#      which names the path as given). The 4-step run also shows that --steps below
#      the file's total_num_steps (8) runs, on the 8-step schedule.
# With NP = 1 also (b) the checks around it: a different --seed, a different --data, a data file
# changed in place, or another train_batch_size are refused, naming both values; with
# --allow-data-change they are accepted with a warning; a data file that moved is found again
# with --data; a checkpoint without the new fields (older zinf) resumes with warnings; --steps
# past total_num_steps warns and holds the last learning rate; "auto" takes --steps.
set -euo pipefail
zinf=$1
np=${2:-1}
tmp=$(mktemp -d "${ZINF_TEST_TMPDIR:-/tmp}/resume.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export ZINF_LOG_LEVEL=warning
model=(--layers 1 --hidden 32 --heads 2 --seq 32)

# A deterministic text corpus (~40 KB) and a second, different one.
python3 - "$tmp/d.txt" "$tmp/other.txt" <<'PY'
import random, sys
words = "the a zero offload tier swap rank step loss batch seed epoch row data order state".split()
for path, seed in ((sys.argv[1], 1), (sys.argv[2], 2)):
    rng = random.Random(seed)
    with open(path, "w") as f:
        f.write(" ".join(rng.choice(words) for _ in range(7000)))
PY

# config DEVICE [TRAIN_BATCH] [TOTAL]: a ds_config with offload to DEVICE, written to stdout.
config() {
  local device=$1 train_batch=${2:-8} total=${3:-8} nvme=""
  [ "$device" = nvme ] && nvme=", \"nvme_path\": \"$tmp/nvme\""
  mkdir -p "$tmp/nvme"
  cat <<JSON
{"train_batch_size": $train_batch, "train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
 "bf16": {"enabled": true},
 "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.01}},
 "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 2, "total_num_steps": $total}},
 "zero_optimization": {"stage": 3, "sub_group_size": 50000, "reduce_bucket_size": 20000,
   "offload_param": {"device": "$device" $nvme}, "offload_optimizer": {"device": "$device" $nvme}}}
JSON
}

# train NAME ARGS...: zinf train on $np ranks; stdout+stderr in $tmp/NAME.out; fails the test
# when it fails.
train() {
  local name=$1
  shift
  local launcher=()
  [ "$np" -gt 1 ] && launcher=(timeout 300 mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$np")
  "${launcher[@]}" "$zinf" train "$@" > "$tmp/$name.out" 2>&1 || { echo "$name failed:"; cat "$tmp/$name.out"; exit 1; }
}

# refused NAME NEEDLE... -- ARGS...: zinf train (one rank) must exit 2 with every NEEDLE in its
# error output.
refused() {
  local name=$1 needles=()
  shift
  while [ "$1" != "--" ]; do needles+=("$1"); shift; done
  shift
  local rc=0
  "$zinf" train "$@" > "$tmp/$name.out" 2>&1 || rc=$?
  [ "$rc" -eq 2 ] || { echo "$name: exit $rc, expected 2:"; cat "$tmp/$name.out"; exit 1; }
  for n in "${needles[@]}"; do
    grep -qF -- "$n" "$tmp/$name.out" || { echo "$name: no '$n' in:"; cat "$tmp/$name.out"; exit 1; }
  done
  echo "$name: refused: $(grep 'zinf train:' "$tmp/$name.out")"
}

# has NAME NEEDLE: the output of run NAME contains NEEDLE.
has() {
  grep -qF -- "$2" "$tmp/$1.out" || { echo "$1: no '$2' in:"; cat "$tmp/$1.out"; exit 1; }
}

# same_run A B: the checkpoints A and B (their latest tags) and the json logs A.jsonl and
# B.jsonl hold the same run, bit for bit.
same_run() {
  local a=$1 b=$2
  python3 - "$tmp/$a.jsonl" "$tmp/$b.jsonl" "$tmp/$a" "$tmp/$b" <<'PY'
import json, sys
la, lb = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
keys = ("step", "loss", "lr", "loss_scale", "grad_norm", "skipped")
ra, rb = ([{k: r[k] for k in keys} for r in rows] for rows in (la, lb))
assert [r["step"] for r in ra] == list(range(1, 9)), ra
assert ra == rb, "losses differ:\n" + "\n".join(f"{x}\n{y}" for x, y in zip(ra, rb) if x != y)

def engine(ckpt):
    tag = open(f"{ckpt}/latest").read().strip()
    j = json.load(open(f"{ckpt}/{tag}/engine.json"))
    client = json.loads(j.pop("client_state"))
    client["data"].pop("source")  # names the path as it was given
    return j, client

assert engine(sys.argv[3]) == engine(sys.argv[4]), (engine(sys.argv[3]), engine(sys.argv[4]))
PY
  "$zinf" consolidate "$tmp/$a" "$tmp/$a.safetensors" > /dev/null
  "$zinf" consolidate "$tmp/$b" "$tmp/$b.safetensors" > /dev/null
  # Byte for byte, apart from the metadata, which names the checkpoint folder.
  python3 - "$tmp/$a.safetensors" "$tmp/$b.safetensors" <<'PY'
import json, struct, sys

def tensors(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        header.pop("__metadata__", None)
        return header, f.read()

(ha, da), (hb, db) = tensors(sys.argv[1]), tensors(sys.argv[2])
assert ha == hb, "tensor names, shapes or offsets differ"
assert len(da) > 0 and da == db, "consolidated weights differ"
PY
  local states=0
  for f in "$tmp/$a"/global_step8/rank*.state; do
    cmp "$f" "$tmp/$b/global_step8/$(basename "$f")"
    states=$((states + 1))
  done
  [ "$states" -eq "$np" ] || { echo "$states rank state files for $np ranks"; exit 1; }
}

# (a) Straight against split, for every offload device.
for device in none cpu nvme; do
  config "$device" > "$tmp/ds_$device.json"
  run=(--config "$tmp/ds_$device.json" "${model[@]}")
  start=$(date +%s)
  train "straight_$device" "${run[@]}" --seed 3 --data "$tmp/d.txt" --steps 8 --save "$tmp/straight_$device" \
    --save-interval 4 --json-log "$tmp/straight_$device.jsonl"
  train "half_$device" "${run[@]}" --seed 3 --data "$tmp/d.txt" --steps 4 --save "$tmp/split_$device" \
    --json-log "$tmp/split_$device.jsonl"
  train "resumed_$device" "${run[@]}" --steps 8 --resume "$tmp/split_$device" --save "$tmp/split_$device" \
    --json-log "$tmp/split_$device.jsonl"
  has "resumed_$device" "resumed from $tmp/split_$device at step 4"
  same_run "straight_$device" "split_$device"
  echo "(a) offload $device, $np rank(s): 8 steps straight == 4 + resume to 8 (losses, weights, optimizer" \
       "state; $(( $(date +%s) - start )) s)"
done
[ "$np" -eq 1 ] || exit 0

# (b) What a resume accepts and refuses (one rank, state in memory).
# The straight run's step-4 checkpoint (from --save-interval), on its own.
run=(--config "$tmp/ds_none.json" "${model[@]}")
ck=$tmp/ck4
mkdir "$ck"
cp -r "$tmp/straight_none/global_step4" "$ck/"
echo global_step4 > "$ck/latest"
refused seed "--seed 5" "seed 3" "--allow-data-change" -- "${run[@]}" --steps 8 --resume "$ck" --seed 5
train same_seed "${run[@]}" --steps 5 --resume "$ck" --seed 3  # the checkpoint's own seed is fine
refused data "--data $tmp/other.txt" "$tmp/d.txt" "--allow-data-change" -- \
  "${run[@]}" --steps 8 --resume "$ck" --data "$tmp/other.txt"
config none 16 > "$tmp/ds_b16.json"
refused batch "16 rows per step" "checkpoint's 8" -- --config "$tmp/ds_b16.json" "${model[@]}" --steps 8 --resume "$ck"
train allowed "${run[@]}" --steps 6 --resume "$ck" --seed 5 --data "$tmp/other.txt" --allow-data-change
has allowed "--seed 5 replaces the checkpoint's seed 3"
has allowed "training on $tmp/other.txt"
has allowed "resumed from $ck at step 4"
echo "(b) --allow-data-change: accepted with warnings"

# A data file changed in place is caught; one that moved is found again with --data.
cp "$tmp/d.txt" "$tmp/moving.txt"
train moving "${run[@]}" --data "$tmp/moving.txt" --seed 3 --steps 4 --save "$tmp/moving"
echo " extra words" >> "$tmp/moving.txt"
refused changed "has changed since it was saved" "$tmp/moving.txt" -- "${run[@]}" --steps 8 --resume "$tmp/moving"
mv "$tmp/moving.txt" "$tmp/moved.txt"
refused moved "the checkpoint's data (give --data if it has moved)" "$tmp/moving.txt" -- \
  "${run[@]}" --steps 8 --resume "$tmp/moving"
cp "$tmp/d.txt" "$tmp/moved.txt"
train moved_found "${run[@]}" --steps 8 --resume "$tmp/moving" --data "$tmp/moved.txt" --json-log "$tmp/moved.jsonl"
python3 - "$tmp/straight_none.jsonl" "$tmp/moved.jsonl" <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
assert [r["loss"] for r in a[4:]] == [r["loss"] for r in b], (a[4:], b)
PY
echo "(b) data changed in place: refused; moved: found again with --data, same losses"

# A checkpoint from an older zinf (client_state with position, seed 3 absent): warnings, and
# the command line's seed and data as before.
cp -r "$ck" "$tmp/old"
python3 - "$tmp/old/global_step4/engine.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
c = json.loads(j["client_state"])
j["client_state"] = json.dumps({"epoch": c["epoch"], "row": c["row"]})
json.dump(j, open(sys.argv[1], "w"))
PY
train old "${run[@]}" --steps 8 --resume "$tmp/old" --seed 3 --data "$tmp/d.txt" --json-log "$tmp/old.jsonl"
has old "does not record its seed"
has old "does not record its data"
python3 - "$tmp/straight_none.jsonl" "$tmp/old.jsonl" <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
assert [r["loss"] for r in a[4:]] == [r["loss"] for r in b], (a[4:], b)
PY
echo "(b) older checkpoint: resumed with warnings"

# --steps is the step to reach: past total_num_steps warns, the learning rate holds its last
# value; "auto" follows --steps unless --total-steps is given.
train past "${run[@]}" --data "$tmp/d.txt" --steps 12 --json-log "$tmp/past.jsonl"
has past "--steps 12 goes past the schedule's end (WarmupDecayLR total_num_steps 8)"
python3 - "$tmp/past.jsonl" "$tmp/straight_none.jsonl" <<'PY'
import json, sys
past, eight = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
assert [r["step"] for r in past] == list(range(1, 13)), past
assert [r["lr"] for r in past[:8]] == [r["lr"] for r in eight], "the 8-step schedule differs"
assert len({r["lr"] for r in past[9:]}) == 1, [r["lr"] for r in past]
PY
sed 's/"total_num_steps": 8/"total_num_steps": "auto"/' "$tmp/ds_none.json" > "$tmp/ds_auto.json"
ZINF_LOG_LEVEL=info train auto --config "$tmp/ds_auto.json" "${model[@]}" --steps 6
has auto "scheduler.params.total_num_steps = 6 (auto: --steps)"
ZINF_LOG_LEVEL=info train auto_total --config "$tmp/ds_auto.json" "${model[@]}" --steps 6 --total-steps 9
has auto_total "scheduler.params.total_num_steps = 9 (auto: --total-steps)"
echo "(b) --steps past the schedule warns; \"auto\" takes --steps"
echo "resume_test: resume continues the saved run"
