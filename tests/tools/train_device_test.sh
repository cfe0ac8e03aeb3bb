#!/usr/bin/env bash
# zinf train --device on this machine. Without a usable GPU (or without the GPU layer): the
# default (auto) trains on the CPU, says so and why, and gives the same losses bit for bit as
# --device cpu; --device cuda fails with exit 2 before any work (the --save folder is never
# made), naming why, for the GPT and for a Llama HF folder alike (both have a GPU model). On a
# machine with a GPU the cuda checks are skipped (exit 77).
set -euo pipefail
zinf="$1" llama_dir="$2"
tmp=$(mktemp -d "${ZINF_TEST_TMPDIR:-/tmp}/train_device.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$zinf" train --model tiny --steps 2 --json-log "$tmp/auto.jsonl" > "$tmp/auto.out" 2> "$tmp/auto.err" ||
  { cat "$tmp/auto.err"; fail "zinf train (auto) failed"; }
line=$(grep '^device: ' "$tmp/auto.out" || true)
[ -n "$line" ] || fail "no 'device:' line at start-up: $(head -3 "$tmp/auto.out")"
case "$line" in
  "device: cuda ("*) echo "a GPU is present ($line): the no-GPU checks do not apply"; exit 77 ;;
  "device: cpu ("*) ;;
  *) fail "unexpected start-up line: $line" ;;
esac
[ "$line" != "device: cpu ()" ] || fail "auto chose the cpu without saying why"

"$zinf" train --device cpu --model tiny --steps 2 --json-log "$tmp/cpu.jsonl" > "$tmp/cpu.out" 2>&1 ||
  fail "zinf train --device cpu failed"
grep -qx 'device: cpu (--device cpu)' "$tmp/cpu.out" || fail "--device cpu: $(grep '^device' "$tmp/cpu.out")"
python3 - "$tmp/auto.jsonl" "$tmp/cpu.jsonl" <<'PY' || fail "auto (on the CPU) and --device cpu differ"
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
assert len(a) == 2 and a == b, (a, b)
PY

# --device-grad-sums: refused where nothing is gathered into device memory, and for a size that is
# not one, naming the flag; taken with the host device.
set +e
"$zinf" train --device cpu --model tiny --steps 1 --device-grad-sums 1G > /dev/null 2> "$tmp/sums.err"
rc=$?
set -e
[ "$rc" -ne 0 ] || fail "--device-grad-sums without device memory was accepted"
grep -q -- '--device-grad-sums 1G: ' "$tmp/sums.err" || fail "--device-grad-sums: unclear error: $(cat "$tmp/sums.err")"
set +e
"$zinf" train --host-device --model tiny --steps 1 --device-grad-sums lots > /dev/null 2> "$tmp/sums.err"
rc=$?
set -e
[ "$rc" -ne 0 ] || fail "--device-grad-sums lots was accepted"
grep -q -- '--device-grad-sums' "$tmp/sums.err" || fail "--device-grad-sums lots: unclear error: $(cat "$tmp/sums.err")"
"$zinf" train --host-device --model tiny --steps 1 --device-grad-sums 1M > /dev/null 2> "$tmp/sums.err" ||
  fail "--host-device --device-grad-sums 1M: $(cat "$tmp/sums.err")"

# With the whole state on the device nothing moves, and the run still reports its device memory.
cat > "$tmp/none.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": true},
 "zero_optimization": {"stage": 3, "offload_param": {"device": "none"}, "offload_optimizer": {"device": "none"}}}
JSON
"$zinf" train --host-device --model tiny --steps 2 --config "$tmp/none.json" --json-log "$tmp/none.jsonl" \
  > "$tmp/none.out" 2> "$tmp/none.err" || fail "--host-device, offload none: $(cat "$tmp/none.err")"
grep -q '^device: 2 steps; nothing moved between host and device (the state is on the device); peak device memory [0-9.]* MiB$' \
  "$tmp/none.out" || fail "offload none on the host device: no device summary: $(grep '^device' "$tmp/none.out")"
grep -q '"device_peak_bytes":[1-9]' "$tmp/none.jsonl" || fail "offload none: no device_peak_bytes in --json-log"

set +e
"$zinf" train --device cuda --model tiny --steps 2 --save "$tmp/ckpt" > "$tmp/cuda.out" 2> "$tmp/cuda.err"
rc=$?
set -e
[ "$rc" -eq 2 ] || fail "--device cuda without a GPU: exit $rc, want 2"
grep -q '^zinf train: --device cuda: ' "$tmp/cuda.err" || fail "--device cuda: unclear error: $(cat "$tmp/cuda.err")"
[ ! -e "$tmp/ckpt" ] || fail "--device cuda failed after work had begun (the --save folder was made)"
! grep -q '^step ' "$tmp/cuda.out" || fail "--device cuda trained a step"

# A Llama folder is refused for the missing GPU, not for being a Llama.
set +e
"$zinf" train --device cuda --model-dir "$llama_dir" --seq 16 --steps 1 > "$tmp/llama.out" 2> "$tmp/llama.err"
rc=$?
set -e
[ "$rc" -eq 2 ] || fail "--device cuda --model-dir (Llama) without a GPU: exit $rc, want 2"
grep -q '^zinf train: --device cuda: ' "$tmp/llama.err" || fail "Llama --device cuda: unclear error: $(cat "$tmp/llama.err")"
! grep -q 'runs on the CPU only' "$tmp/llama.err" || fail "Llama refused as CPU-only: $(cat "$tmp/llama.err")"
echo "ok: $line; --device cuda: $(cat "$tmp/cuda.err"); Llama: $(cat "$tmp/llama.err")"
