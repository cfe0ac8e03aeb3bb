#!/usr/bin/env bash
# zinf eval --resume: the windows are the file's first N*B in order (B=2,N=3 and B=3,N=2 and
# B=6,N=1 read the same six windows and agree to float rounding of the per-batch means), --json
# prints loss and tokens, a trained checkpoint evaluates lower than an early one, and bad input
# (too few tokens, a token outside the vocabulary, a missing checkpoint, --seq past max_seq)
# fails with exit status 2 and a message naming the option and value. Also: zinf train --resume
# with no model option takes the model the checkpoint records.
set -euo pipefail
zinf=$1
tmp=$(mktemp -d "${ZINF_TEST_TMPDIR:-/tmp}/eval_test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export ZINF_LOG_LEVEL=warning
cat > "$tmp/ds.json" <<JSON
{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
 "zero_optimization": {"stage": 3, "sub_group_size": 50000}}
JSON
"$zinf" train --config "$tmp/ds.json" --model tiny --steps 40 --save "$tmp/ck" --save-interval 2 >"$tmp/train.out" 2>&1 \
  || { cat "$tmp/train.out"; exit 1; }
head -c 4000 /usr/share/common-licenses/GPL-3 > "$tmp/text.txt"

loss() { "$zinf" eval --resume "$1" --data "$tmp/text.txt" --seq 32 --json "${@:2}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["loss"])'; }
a=$(loss "$tmp/ck" --batch 2 --batches 3)
b=$(loss "$tmp/ck" --batch 3 --batches 2)
c=$(loss "$tmp/ck" --batch 6 --batches 1)
early=$(loss "$tmp/ck/global_step2" --batch 6 --batches 1)
python3 - "$a" "$b" "$c" "$early" <<'PY'
import sys
a, b, c, early = map(float, sys.argv[1:])
for x in (b, c):
    assert abs(x - a) <= 1e-6 * abs(a), f"same six windows, different losses: {a} {b} {c}"
assert c < early - 0.3, f"40 steps ({c}) should evaluate well below 2 steps ({early})"
print(f"eval_test: six windows {a:.6f} / {b:.6f} / {c:.6f}; step 2 {early:.6f}")
PY
json=$("$zinf" eval --resume "$tmp/ck" --data "$tmp/text.txt" --seq 32 --batch 6 --batches 1 --json)
python3 -c 'import json,sys; j=json.loads(sys.argv[1]); assert j["tokens"] == 6*32 and j["batches"] == 1, j' "$json"

# expect_error STATUS TEXT ARGS...: zinf eval ARGS fails with STATUS and prints TEXT.
expect_error() {
  local want=$1 text=$2
  shift 2
  set +e
  "$zinf" eval "$@" >"$tmp/err.out" 2>&1
  local got=$?
  set -e
  [ "$got" -eq "$want" ] || { echo "zinf eval $*: exit $got, expected $want"; cat "$tmp/err.out"; exit 1; }
  grep -qF -- "$text" "$tmp/err.out" || { echo "zinf eval $*: expected '$text' in:"; cat "$tmp/err.out"; exit 1; }
}
expect_error 2 "room for 20 batches" --resume "$tmp/ck" --data "$tmp/text.txt" --seq 32 --batch 6 --batches 21
expect_error 2 "--seq 65 is longer than the model's max positions 64" --resume "$tmp/ck" --seq 65
expect_error 2 "neither a checkpoint folder" --resume "$tmp/nothing"
# An llm.c token file (GPT-2 ids) whose token 70 is 300: outside the byte model's 256.
python3 - "$tmp/tokens.bin" <<'PY'
import struct, sys
tokens = [i % 200 for i in range(70)] + [300] + [5] * 100
header = [20240520, 1, len(tokens)] + [0] * 253
open(sys.argv[1], "wb").write(struct.pack("<256i", *header) + struct.pack(f"<{len(tokens)}H", *tokens))
PY
expect_error 2 "tokens.bin: token at byte offset 1164 is 300, outside the model's vocabulary of 256" \
  --resume "$tmp/ck" --data "$tmp/tokens.bin" --seq 16 --batch 2 --batches 5
# A raw little-endian uint32 file (Llama-3-sized ids) whose token 50 is 128300: byte offset 200.
python3 - "$tmp/ids.u32" "$tmp/odd.u16" <<'PY'
import struct, sys
tokens = [i % 200 for i in range(50)] + [128300] + [5] * 150
open(sys.argv[1], "wb").write(struct.pack(f"<{len(tokens)}I", *tokens))
open(sys.argv[2], "wb").write(b"\x01\x00\x02")
PY
expect_error 2 "ids.u32: token at byte offset 200 is 128300, outside the model's vocabulary of 256" \
  --resume "$tmp/ck" --data "$tmp/ids.u32" --data-format uint32 --seq 16 --batch 2 --batches 5
expect_error 1 "odd.u16: 3 bytes is not a whole number of 2-byte uint16 tokens" \
  --resume "$tmp/ck" --data "$tmp/odd.u16" --data-format uint16
expect_error 2 "--data-format" --resume "$tmp/ck" --data "$tmp/ids.u32" --data-format u32
# zinf train names the same token before it builds an engine.
set +e
"$zinf" train --config "$tmp/ds.json" --steps 42 --resume "$tmp/ck" --data "$tmp/ids.u32" --data-format uint32 \
  --allow-data-change >"$tmp/train_oov.out" 2>&1
got=$?
set -e
[ "$got" -ne 0 ] && grep -qF "ids.u32: token at byte offset 200 is 128300, outside the model's vocabulary of 256" \
  "$tmp/train_oov.out" || { echo "zinf train: exit $got, expected the out-of-vocabulary token named"; cat "$tmp/train_oov.out"; exit 1; }
# A resume with no model option trains the checkpoint's model (here tiny, not the default small).
"$zinf" train --config "$tmp/ds.json" --steps 42 --resume "$tmp/ck" >"$tmp/resume.out" 2>&1 \
  || { cat "$tmp/resume.out"; exit 1; }
grep -q "gpt: 2 layers, hidden 64" "$tmp/resume.out" || { echo "resume did not take the checkpoint's model"; cat "$tmp/resume.out"; exit 1; }
echo "eval_test: window order, --json, and every error checked"
