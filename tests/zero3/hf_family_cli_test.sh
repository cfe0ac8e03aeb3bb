#!/usr/bin/env bash
# zinf train / consolidate / eval on the Llama-family fixtures (tests/model/data/hf_families:
# Llama 3.2 with llama3 RoPE in bf16, Qwen2, Qwen3, Mistral; made by transformers, this test needs
# no torch):
#  (a) --model-dir's default window is min(max positions, 2048), said in one line; --seq sets it;
#      a --seq above the model's max positions is an error naming both;
#  (b) trained one step at lr 0, saved and consolidated with --hf, every tensor comes back
#      bit-identical in the folder's own dtype (BF16 stays BF16), config.json says the dtype and
#      the family (model_type, architectures); --dtype fp32 overrides; the export opens again and
#      evaluates as the checkpoint does;
#  (c) --resume takes the checkpoint's window; another --seq is refused unless
#      --allow-data-change;
#  (d) --model-config trains a config.json's architecture from a fresh initialisation.
set -euo pipefail
zinf=$1 fixtures=$2
tmp=$(mktemp -d "${ZINF_TEST_TMPDIR:-/tmp}/hf_family_cli.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export ZINF_LOG_LEVEL=warning
python3 - "$tmp/ids.u16" <<'PY'
import random, struct, sys
r = random.Random(7)
open(sys.argv[1], "wb").write(struct.pack("<4000H", *[r.randrange(61) for _ in range(4000)]))
PY
data=(--data "$tmp/ids.u16" --data-format uint16)
cat > "$tmp/lr0.json" <<JSON
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.0, "weight_decay": 0.0}},
 "zero_optimization": {"stage": 3, "sub_group_size": 50000}}
JSON
expect_error() {  # expect_error CODE MESSAGE ARGS...
  local code=$1 msg=$2
  shift 2
  set +e
  "$zinf" "$@" > "$tmp/err.out" 2>&1
  local rc=$?
  set -e
  if [[ $rc != "$code" ]] || ! grep -qF -- "$msg" "$tmp/err.out"; then
    echo "zinf $*: expected exit $code and '$msg', got $rc:"; cat "$tmp/err.out"; exit 1
  fi
}

for f in llama32_tiny qwen2_tiny qwen3_tiny mistral_tiny mistral_nemo_tiny; do
  dir=$fixtures/$f
  # (a)
  "$zinf" train --config "$tmp/lr0.json" --model-dir "$dir" "${data[@]}" --steps 1 --save "$tmp/$f.ck" \
    > "$tmp/train.out" 2>&1 || { cat "$tmp/train.out"; exit 1; }
  want="window: 64 tokens per row (--seq; default min(max positions 64, 2048))"
  [[ $f != mistral_tiny ]] || want="window: 32 tokens per row (--seq; default min(max positions 64, sliding window 32, 2048))"
  grep -qF "$want" "$tmp/train.out" ||
    { echo "$f: no window line"; cat "$tmp/train.out"; exit 1; }
  [[ $f != mistral_tiny ]] || expect_error 2 "--seq 33 is above the model's sliding_window (32)" \
    train --config "$tmp/lr0.json" --model-dir "$dir" "${data[@]}" --steps 1 --seq 33
  expect_error 2 "--seq 65 must be between 1 and the model's max positions (64, max_position_embeddings in $dir/config.json)" \
    train --config "$tmp/lr0.json" --model-dir "$dir" "${data[@]}" --steps 1 --seq 65
  # (b)
  "$zinf" consolidate "$tmp/$f.ck" "$tmp/$f.out" --hf > "$tmp/cons.out"
  "$zinf" consolidate "$tmp/$f.ck" "$tmp/$f.f32" --hf --dtype fp32 > /dev/null
  python3 - "$dir" "$tmp/$f.out" "$tmp/$f.f32" <<'PY'
import json, struct, sys
def tensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in header.items()}
src, out, f32 = sys.argv[1], sys.argv[2], sys.argv[3]
ref, got = tensors(src + "/model.safetensors"), tensors(out + "/model.safetensors")
assert sorted(ref) == sorted(got), sorted(set(ref) ^ set(got))
for k in ref:
    assert ref[k] == got[k], f"{k} differs after the round trip ({ref[k][0]} -> {got[k][0]})"
a, b = json.load(open(src + "/config.json")), json.load(open(out + "/config.json"))
for key in ("model_type", "architectures", "dtype", "hidden_size", "head_dim", "num_key_value_heads",
            "tie_word_embeddings", "max_position_embeddings"):
    if key in a:
        assert a[key] == b.get(key), f"config.json {key}: {a[key]} -> {b.get(key)}"
assert b["torch_dtype"] == a["dtype"]
for k, v in a["rope_parameters"].items():  # the export may add the type's defaults (yarn's beta_fast...)
    assert b["rope_parameters"].get(k) == v, (k, a["rope_parameters"], b["rope_parameters"])
wide = tensors(f32 + "/model.safetensors")
assert all(v[0] == "F32" for v in wide.values()) and json.load(open(f32 + "/config.json"))["dtype"] == "float32"
print(f"hf_family_cli (b): {a['model_type']} {a['dtype']}: {len(ref)} tensors bit-identical after the round trip")
PY
  grep -qF "dtype: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["dtype"])' "$dir/config.json") (the folder the run started from" "$tmp/cons.out"
  l1=$("$zinf" eval --model-dir "$tmp/$f.out" "${data[@]}" --batch 2 --batches 2 --json)
  l2=$("$zinf" eval --resume "$tmp/$f.ck" "${data[@]}" --batch 2 --batches 2 --json)
  python3 - "$l1" "$l2" <<'PY'
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert a["seq"] == b["seq"] and a["seq"] in (32, 64), (a["seq"], b["seq"])
assert a["loss"] == b["loss"], (a["loss"], b["loss"])
PY
done

# (c) on one family: the window comes back from the checkpoint.
f=qwen3_tiny
"$zinf" train --config "$tmp/lr0.json" --model-dir "$fixtures/$f" "${data[@]}" --steps 1 --seq 16 --save "$tmp/w.ck" \
  > /dev/null
"$zinf" train --config "$tmp/lr0.json" --resume "$tmp/w.ck" --steps 2 --save "$tmp/w.ck" > "$tmp/r.out" 2>&1 ||
  { cat "$tmp/r.out"; exit 1; }
python3 - "$tmp/w.ck" <<'PY'
import json, sys
tag = open(sys.argv[1] + "/latest").read().strip()
state = json.loads(json.load(open(f"{sys.argv[1]}/{tag}/engine.json"))["client_state"])
assert state["seq"] == 16 and state["source_dtype"] == "float32", state
PY
expect_error 2 "the checkpoint was trained on rows of 16 tokens (--seq 16), this run has --seq 32" \
  train --config "$tmp/lr0.json" --resume "$tmp/w.ck" --steps 3 --seq 32
"$zinf" train --config "$tmp/lr0.json" --resume "$tmp/w.ck" --steps 3 --seq 32 --allow-data-change > /dev/null 2>&1

# (d) --model-config: a config.json's architecture (or its folder's) from zinf's own
# initialisation, no weights read: the export has the fixture's tensor names, shapes and config
# with other values; the file and its folder give the same run, another --seed another one.
dir=$fixtures/llama32_tiny
from_config() {  # from_config NAME ARGS...: one step at lr 0, its loss in $tmp/NAME.jsonl
  local name=$1
  shift
  "$zinf" train --config "$tmp/lr0.json" "${data[@]}" --steps 1 --json-log "$tmp/$name.jsonl" "$@" > "$tmp/$name.out" 2>&1 ||
    { cat "$tmp/$name.out"; exit 1; }
}
from_config cfg_file --model-config "$dir/config.json" --seed 5 --save "$tmp/cfg.ck"
from_config cfg_dir --model-config "$dir" --seed 5
from_config cfg_seed --model-config "$dir" --seed 6
from_config weights --model-dir "$dir" --seed 5
"$zinf" consolidate "$tmp/cfg.ck" "$tmp/cfg.out" --hf > /dev/null
python3 - "$tmp" "$dir" <<'PY'
import json, struct, sys
tmp, src = sys.argv[1], sys.argv[2]
def tensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    return {k: (v["shape"], raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in header.items()}
loss = {k: json.loads(open(f"{tmp}/{k}.jsonl").readline())["loss"] for k in ("cfg_file", "cfg_dir", "cfg_seed", "weights")}
assert loss["cfg_file"] == loss["cfg_dir"], loss
assert len(set([loss["cfg_file"], loss["cfg_seed"], loss["weights"]])) == 3, loss
ref, got = tensors(src + "/model.safetensors"), tensors(tmp + "/cfg.out/model.safetensors")
assert sorted(ref) == sorted(got), sorted(set(ref) ^ set(got))
assert all(ref[k][0] == got[k][0] for k in ref), "shapes differ"
assert sum(ref[k][1] != got[k][1] for k in ref) >= len(ref) - 4, "the fixture's weights were read"  # norms start at 1 both ways
a, b = json.load(open(src + "/config.json")), json.load(open(tmp + "/cfg.out/config.json"))
for key in ("model_type", "hidden_size", "num_hidden_layers", "num_key_value_heads", "tie_word_embeddings", "vocab_size"):
    assert a[key] == b[key], (key, a[key], b[key])
print(f"hf_family_cli (d): --model-config losses {loss}")
PY
expect_error 2 "--model-config takes the model from that config.json: drop --model" \
  train --model-config "$dir" --model small "${data[@]}" --steps 1
expect_error 2 "--model-config and --model-dir both give the model" \
  train --model-config "$dir" --model-dir "$dir" "${data[@]}" --steps 1
expect_error 2 "--model-config: open $tmp/none.json" train --model-config "$tmp/none.json" "${data[@]}" --steps 1
echo '{"model_type": "bert"}' > "$tmp/bert.json"
expect_error 2 "--model-config: $tmp/bert.json: model_type \"bert\" is not one zinf builds" \
  train --model-config "$tmp/bert.json" "${data[@]}" --steps 1
echo "hf_family_cli: windows, bf16/fp32 round trips, resumed windows and --model-config checked"
