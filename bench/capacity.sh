#!/usr/bin/env bash
# Capacity (issue 23): GPT and Llama shapes trained a few steps with parameters, gradients and optimizer
# state on NVMe in DIR, after `aio_bench --quick` on DIR. Prints one table row per size:
# parameters, bytes on disk per parameter (the swap folder's peak, sampled every second), peak
# RSS, the last step's time and breakdown (with --steps 4 or more: the step of steps 3..N with the
# median optimizer phase), NVMe bytes per step, and I/O efficiency of the
# optimizer phase = (its bytes at aio_bench's best read and write bandwidths) / its time. The
# optimizer phase's bytes are the formula of its transfers per parameter (fp32 master, exp_avg,
# exp_avg_sq read and written, fp32 gradients read, the 16-bit copy written: 30 bytes), not a
# measurement. Without --sizes: the largest preset whose state fits 0.8 of DIR's free space.
#
# Sizes: zinf train's GPT presets, or a Llama shape of bench/make_llama_folder.py (llama-1b,
# tinyllama, llama-7b, llama-mini), optionally with a layer count after a colon (tinyllama:30):
# its folder (config.json, bf16 weights drawn afresh) is written under DIR for the run and
# trained with --model-dir; DeepSpeed's peer takes GPT presets only.
# Usage: bench/capacity.sh DIR [--sizes "small gpt2 gpt2-medium"] [--steps 3] [--seq 256]
#                             [--zinf build/tools/zinf/zinf] [--no-aio-bench] [--live N]
#                             [--budget SIZE] [--train-args "ARGS"] [--deepspeed] [--ds-rss-cap BYTES]
#                             [--timeout S] [--sub-group-size N] [--no-pipeline]
#                             [--param-buffers N] [--zero '"key": value, ...'] [--lr LR]
#                             [--keep-logs DIR]
# --live N: stage3_max_live_parameters and stage3_prefetch_bucket_size (default: the reference's
# 1e9 and 5e7, which keep every gathered parameter of a model under 1e9 in fp32 memory).
# --budget SIZE: zinf train --host-memory-budget SIZE (e.g. 3G): the pools, gathers and buckets
# sized to fit it (docs/zero3.md, "The host-memory budget"). --train-args: more zinf train
# options for every size, e.g. "--activation-checkpointing".
# --deepspeed: after each size's zinf run, DeepSpeed ZeRO-3 (CPU accelerator) at the same size
# with the same ds.json (bench/capacity_deepspeed.py, in the Python environment of
# bench/cpu_side_by_side.sh: ZINF_BENCH_VENV, default ~/.cache/zinf-bench-venv); the rows then
# start with the engine, zinf or deepspeed; a run DeepSpeed fails prints a FAILED row with why.
# --ds-rss-cap BYTES: the RSS at which the DeepSpeed run is stopped (default: MemAvailable at its
# start less 1 GiB; "none": no cap, the OOM killer decides, and it takes DeepSpeed first).
# --sub-group-size N: zero_optimization.sub_group_size in the ds.json both engines read (default:
# the reference's 1e9: one sub-group below 1e9 parameters).
# --no-pipeline: offload_optimizer pipeline_read and pipeline_write false (both engines).
# --param-buffers N: offload_param buffer_count (both engines; the reference's default is 5).
# --zero MEMBERS: more zero_optimization members for both engines, as JSON text.
# --lr LR: AdamW's learning rate, constant (default 1e-6 for GPT presets, 3e-5 for Llama shapes).
# Adam's first steps move every weight by about lr whatever its gradient's scale (m / sqrt(v) is
# about +-1): from the GPT presets' initial weights 1e-4 overshot (the loss rose at the second
# step at every size, in both engines), and 1e-6 gives a falling loss from 0.3B to 1.2B; the
# Llama shapes (pre-RMSNorm) learn nothing visible at 1e-6 and fall steadily at 3e-5 and 1e-4.
# --keep-logs DIR: copy each zinf run's --json-log (every step) to DIR/SIZE.jsonl.
# --timeout S: stop a run (zinf or DeepSpeed) after S seconds (default 1800).
# Slow: a 1B model takes many minutes per step on 2 cores. Run nothing else meanwhile.
set -euo pipefail
dir=$1; shift
sizes=""; steps=3; seq=256; zinf=build/tools/zinf/zinf; aio=1; live=""; budget=(); extra=()
deepspeed=0; ds_cap=(); timeout=1800; lr=""; zero_more=""; pipeline=true; param_buffers=""; keep_logs=""
while [ $# -gt 0 ]; do
  case $1 in
    --sizes) sizes=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --zinf) zinf=$2; shift 2 ;;
    --no-aio-bench) aio=0; shift ;;
    --budget) budget=(--host-memory-budget "$2"); shift 2 ;;
    --train-args) read -r -a extra <<< "$2"; shift 2 ;;
    --deepspeed) deepspeed=1; shift ;;
    --ds-rss-cap) ds_cap=(--rss-cap "$2"); shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --lr) lr=$2; shift 2 ;;
    --no-pipeline) pipeline=false; shift ;;
    --keep-logs) keep_logs=$2; mkdir -p "$keep_logs"; shift 2 ;;
    --param-buffers) param_buffers=", \"buffer_count\": $2"; shift 2 ;;
    --zero) zero_more="$zero_more, $2"; shift 2 ;;
    --sub-group-size) zero_more="$zero_more, \"sub_group_size\": $2"; shift 2 ;;
    --live) live=", \"stage3_max_live_parameters\": $2, \"stage3_prefetch_bucket_size\": $2"; shift 2 ;;
    *) echo "capacity.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$dir"
work=$(mktemp -d "$dir/capacity.XXXXXX")
trap 'rm -rf "$work"' EXIT
disk_per_param=30  # bytes: bf16 parameters 2, master/exp_avg/exp_avg_sq x 2 slots 24, gradients 4
free=$(df --output=avail -B1 "$dir" | tail -1)
if [ -z "$sizes" ]; then
  # Parameter counts of the presets (zinf train --help lists them), largest first.
  for s in 13b 6.7b 2.7b gpt2-xl 1.3b gpt2-large gpt2-medium gpt2 small; do
    # "Model with 124M total params": rounded, enough to choose a size.
    n=$("$zinf" estimate --model "$s" 2>/dev/null | sed -n 's/.*Model with \([0-9.]*\)\([MB]\) total params.*/\1 \2/p' |
        awk '{ printf "%.0f", $1 * ($2 == "B" ? 1e9 : 1e6) }' || true)
    [ -n "$n" ] || continue
    if [ $(( n * disk_per_param )) -le $(( free * 8 / 10 )) ]; then sizes=$s; break; fi
  done
  echo "free space in $dir: $((free / 1000000000)) GB; largest preset whose state fits 0.8 of it: $sizes"
fi
if [ "$deepspeed" = 1 ]; then
  venv=${ZINF_BENCH_VENV:-$HOME/.cache/zinf-bench-venv}
  here=$(cd "$(dirname "$0")" && pwd)
  "$here/cpu_side_by_side/make_venv.sh" "$venv" "${ZINF_BENCH_TORCH_FROM:-}"
fi
rbw=0; wbw=0; aio_block=""; aio_member=""
if [ "$aio" = 1 ]; then
  bench=$(dirname "$zinf")/../aio_bench/aio_bench
  "$bench" --dir "$work" --quick --json "$work/aio.json" > "$work/aio.txt" 2>&1 || { cat "$work/aio.txt"; exit 1; }
  rbw=$(sed -n 's/^Best read: *\([0-9.]*\) GB\/s.*/\1/p' "$work/aio.txt")
  wbw=$(sed -n 's/^Best write: *\([0-9.]*\) GB\/s.*/\1/p' "$work/aio.txt")
  # The "aio" block it recommends goes into ds.json, as a user pastes it.
  aio_block=$(python3 -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))["aio"]))' "$work/aio.json")
  aio_member=" \"aio\": $aio_block,"
  echo "aio_bench --quick on $dir: best read $rbw GB/s, best write $wbw GB/s; ds.json gets its \"aio\": $aio_block"
fi
# write_config LR: the ds.json both engines read.
write_config() {
  cat > "$work/ds.json" <<JSON
{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": true},$aio_member
 "optimizer": {"type": "AdamW", "params": {"lr": $1}},
 "zero_optimization": {"stage": 3$live$zero_more,
   "offload_param": {"device": "nvme", "nvme_path": "$work/nvme"$param_buffers},
   "offload_optimizer": {"device": "nvme", "nvme_path": "$work/nvme", "pipeline_read": $pipeline, "pipeline_write": $pipeline}}}
JSON
}
engine() { [ "$deepspeed" = 1 ] && printf '%-10s ' "$1"; return 0; }
engine engine
printf '%-12s %14s %10s %12s %9s %8s %8s %8s %8s %12s %8s %s\n' size params disk_B/p peak_RSS_MiB step_s fwd_s bwd_s optim_s io_s nvme_MB/step io_eff losses
for s in $sizes; do
  rm -rf "$work/nvme"; mkdir -p "$work/nvme"; : > "$work/log.jsonl"
  model=(--model "$s"); llama=""; size_lr=${lr:-1e-6}
  case $s in
    llama*|tinyllama*)
      size_lr=${lr:-3e-5}
      llama=$work/model-$s; shape=${s%%:*}; layers=""
      [ "$shape" != "$s" ] && layers=${s#*:}
      python3 "$(dirname "$0")/make_llama_folder.py" "$llama" "$shape" --seq "$seq" ${layers:+--layers "$layers"} > /dev/null
      model=(--model-dir "$llama") ;;
  esac
  write_config "$size_lr"
  "$zinf" train --config "$work/ds.json" "${model[@]}" --seq "$seq" --steps "$steps" --json-log "$work/log.jsonl" "${budget[@]}" "${extra[@]}" \
    > "$work/out.txt" 2>&1 &
  pid=$!
  peak_disk=0; start=$SECONDS; stopped=""
  while kill -0 "$pid" 2>/dev/null; do
    d=$(du -sb "$work/nvme" 2>/dev/null | cut -f1 || echo 0)
    [ "${d:-0}" -gt "$peak_disk" ] && peak_disk=$d
    if [ $((SECONDS - start)) -gt "$timeout" ] && [ -z "$stopped" ]; then
      stopped="stopped after $timeout s"; kill "$pid" 2>/dev/null || true
    fi
    sleep 1
  done
  n=""
  if wait "$pid" && [ -z "$stopped" ]; then
    [ -n "$keep_logs" ] && cp "$work/log.jsonl" "$keep_logs/$s.jsonl"
    n=$(sed -n 's/^model \([0-9]*\) params.*/\1/p' "$work/out.txt" | head -1)
    engine zinf
    python3 - "$s" "$n" "$peak_disk" "$rbw" "$wbw" "$work/log.jsonl" <<'PY'
import json, sys
size, n, disk, rbw, wbw, log = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4] or 0), float(sys.argv[5] or 0), sys.argv[6]
lines = [json.loads(l) for l in open(log) if l.strip()]
read, write = n * (12 + 4), n * (12 + 2)  # optimizer phase: master+2 states (+grads) read; master+2 states (+copy) written
def eff_of(step):
    return ((read / (rbw * 1e9) + write / (wbw * 1e9)) / step["optimizer_s"]) if rbw > 0 and wbw > 0 else float("nan")
# The row: the last step of up to 3; with more, the step of steps 3..N whose optimizer phase is
# the median (the slower middle one of an even count). Steps 1 and 2 write the optimizer's two
# state slots for the first time, and a disk may write new blocks slower than written ones.
row = len(lines) - 1
if len(lines) >= 4:
    later = sorted(range(2, len(lines)), key=lambda i: lines[i]["optimizer_s"])
    row = later[len(later) // 2]
last = lines[row]
per_step = (last["nvme_bytes"] - lines[row - 1]["nvme_bytes"]) if row > 0 else last["nvme_bytes"]
losses = " ".join(f"{l['loss']:.3f}" for l in lines)
print(f"{size:<12} {n:>14} {disk / n:>10.2f} {max(l['peak_rss_bytes'] for l in lines) / 2**20:>12.0f} {last['step_s']:>9.2f} "
      f"{last['forward_s']:>8.2f} {last['backward_s']:>8.2f} {last['optimizer_s']:>8.2f} {last['io_wait_s']:>8.2f} "
      f"{per_step / 1e6:>12.0f} {eff_of(last):>8.2f} {losses}")
if len(lines) >= 4:
    print(f"  {size}: the row is step {row + 1} of {len(lines)}, the median optimizer phase of steps 3-{len(lines)}; "
          f"io_eff by step: " + " ".join(f"{eff_of(l):.2f}" for l in lines))
PY
  else
    engine zinf; echo "$s: zinf train failed${stopped:+ ($stopped)}:"; tail -5 "$work/out.txt"
  fi
  [ -n "$llama" ] && rm -rf "$llama"
  [ "$deepspeed" = 1 ] || continue
  if [ -n "$llama" ]; then engine deepspeed; echo "$s: not run (the DeepSpeed peer builds GPT presets only)"; continue; fi
  rm -rf "$work/nvme"; mkdir -p "$work/nvme"
  if ! DS_ACCELERATOR=cpu PYTHONWARNINGS=ignore OMP_NUM_THREADS=$(nproc) \
      "$venv/bin/python" "$here/capacity_deepspeed.py" "$s" --label deepspeed --config "$work/ds.json" \
      --steps "$steps" --seq "$seq" --timeout "$timeout" --rbw "${rbw:-0}" --wbw "${wbw:-0}" ${n:+--zinf-params "$n"} "${ds_cap[@]}"; then
    # The work folder goes at exit: keep DeepSpeed's output of a failed run beside it.
    cp "$work/deepspeed-$s.log" "$dir/deepspeed-$s.log" 2>/dev/null && echo "  (DeepSpeed's output: $dir/deepspeed-$s.log)" || true
  fi
done
