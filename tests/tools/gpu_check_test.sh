#!/usr/bin/env bash
# scripts/gpu-check on this machine (no GPU): --dry-run lists both phases; bad options are exit 2;
# phase 1 from the build fails at the first GPU test under ZINF_EXPECT_GPU=1 (a skip would hide
# a missing GPU) and leaves exactly summary.txt and one archive, the summary naming the failure and
# CUDA's reason; a spent budget is a failure naming it; and the train (GPT and Llama HF folder) and
# loss-comparison steps run end to end with --device cpu (both runs on the CPU: every loss equal). On a machine with a
# GPU the no-GPU part is skipped (the script's real run there is the device check itself).
set -euo pipefail
script=$1 build=$2
tmp=$(mktemp -d "${ZINF_TEST_TMPDIR:-/tmp}/gpu_check.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$script" -C "$build" --phase 1,2 --dry-run -o "$tmp/dry" > "$tmp/dry.out" 2>&1 || { cat "$tmp/dry.out"; fail "--dry-run failed"; }
for want in "phase 1 (budget 300s)" "phase 2 (budget 480s)" "gpu_memory_test --gtest_filter=-*WithoutGpu.*" \
            "gpu_kernels_test" "gpu_model_test" "gpu_llama_test --gtest_filter=-*WithoutGpu.*" "nccl_device_test" "comm_nccl_test" "gds_real, gds" "gds_reader_test" "gds_reader_real, gds" \
            "train_cuda_3, train" "losses_cpu_vs_cuda, compare" "train_llama_cuda_3, train" "hf_families/mistral_tiny" "check_small.json" "gpu_copy_bench, bench" \
            "aio_bench --gpu" "a_gpt2_gpu, figure" "b_1p3b_offload_cpu, figure"; do
  grep -qF -- "$want" "$tmp/dry.out" || { cat "$tmp/dry.out"; fail "--dry-run does not list '$want'"; }
done
[ ! -e "$tmp/dry" ] || fail "--dry-run created its output folder"
# (b) with the parameters resident; --with-c: aio_bench on the scratch folder, then (c) on the
# largest preset whose NVMe state fits (a preset name, never empty).
"$script" -C "$build" --phase 2 --with-c --dry-run > "$tmp/dry_c.out" 2>&1 || { cat "$tmp/dry_c.out"; fail "--with-c --dry-run failed"; }
for want in b_1p3b_offload_cpu_resident.json b_2p7b_offload_cpu_resident.json "--model-config" llama32_3b_config.json \
            llama2_7b_config.json b_llama7b_offload_cpu_resident.json "plan_b_1p3b, plan" "plan_a_1p3b, plan" \
            "plan_b_llama7b, plan" "--predict"; do
  grep -qF -- "$want" "$tmp/dry_c.out" || { cat "$tmp/dry_c.out"; fail "no step runs $want"; }
done
grep -n "aio_bench_c, bench\|c_nvme_offload, figure" "$tmp/dry_c.out" | cut -d: -f1 | tr '\n' ' ' > "$tmp/order"
[ "$(wc -w < "$tmp/order")" -eq 2 ] && [ "$(cut -d' ' -f1 "$tmp/order")" -lt "$(cut -d' ' -f2 "$tmp/order")" ] ||
  { cat "$tmp/dry_c.out"; fail "aio_bench_c must come just before c_nvme_offload"; }
grep -E "c_nvme_offload, figure.*--model (6\.7b|2\.7b|gpt2-xl|1\.3b) " "$tmp/dry_c.out" > /dev/null ||
  { cat "$tmp/dry_c.out"; fail "c_nvme_offload names no preset"; }

# The summary's ratio lines (gpu-check's ratios function on a details file): s/step against the
# reference, and (b)'s share of (a)'s model TFLOPS.
printf '%s\n' "a_1p3b_gpu: gpu: 7 steps after the first: 0.200 s/step, 9 tok/s, model 400.00 TFLOPS (6*N)" \
  "a_1p3b_gpu_gemm_attention: gpu: 7 steps after the first: 0.250 s/step, 9 tok/s, model 320.00 TFLOPS (6*N)" \
  "b_2p7b_resident: gpu: 2 steps after the first: 13.500 s/step, 9 tok/s, model 300.00 TFLOPS (6*N)" > "$tmp/details"
bash -c 'source <(sed -n "/^ratio_pairs=/,/^}/p" "$1"); ratios "$2"' _ "$script" "$tmp/details" > "$tmp/ratios"
grep -qxF "ratio: a_1p3b_gpu vs a_1p3b_gpu_gemm_attention: s/step 0.200 / 0.250 = 0.800" "$tmp/ratios" &&
  grep -qxF "ratio: b_2p7b_resident vs a_1p3b_gpu: model TFLOPS 300.00 / 400.00 = 0.750 (goal >= 0.7)" "$tmp/ratios" &&
  [ "$(wc -l < "$tmp/ratios")" -eq 2 ] || { cat "$tmp/ratios"; fail "the ratio lines"; }

rc=0; "$script" -C "$build" --phase 3 > "$tmp/bad.out" 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q "phase must be 1, 2 or 1,2, not '3'" "$tmp/bad.out" || { cat "$tmp/bad.out"; fail "--phase 3: exit $rc"; }

if command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; then
  echo "a GPU is present: the no-GPU run is not checked here"
else
  # A step that needs more than the machine has (the 7B (b): an H200's memory) is not run, and
  # the reason names what it needs and what is here; a step with no needs runs anywhere.
  bash -c 'source <(sed -n "/^declare -A step_needs=/,/^}/p" "$1"); if fits_machine b_llama7b_resident; then exit 1; fi
           echo "$fits_why"; fits_machine a_1p3b_gpu' _ "$script" > "$tmp/fits" || { cat "$tmp/fits"; fail "fits_machine"; }
  grep -q "^not run here: it needs 110000 MiB of GPU memory and 125829120 KiB of RAM; this machine has no MiB" "$tmp/fits" ||
    { cat "$tmp/fits"; fail "the 7B step's reason: $(cat "$tmp/fits")"; }
  rc=0; "$script" -C "$build" --phase 1,2 -o "$tmp/run" > "$tmp/run.out" 2>&1 || rc=$?
  [ "$rc" -eq 1 ] || { cat "$tmp/run.out"; fail "phase 1 without a GPU: exit $rc, want 1"; }
  [ "$(ls "$tmp/run" | tr '\n' ' ')" = "gpu-check-phase1-2.tar.xz summary.txt " ] || fail "output folder holds: $(ls "$tmp/run")"
  head -n 1 "$tmp/run/summary.txt" | grep -qF "phase 1,2: FAILED at phase 1 gpu_test" || { cat "$tmp/run/summary.txt"; fail "first line"; }
  grep -qF "ZINF_EXPECT_GPU=1, but" "$tmp/run/summary.txt" || { cat "$tmp/run/summary.txt"; fail "no CUDA reason in the summary"; }
  grep -q "^  2 " "$tmp/run/summary.txt" && fail "phase 2 ran after a failed phase 1"
  tar -tJf "$tmp/run/gpu-check-phase1-2.tar.xz" | grep -qx "logs/gpu_test.log" || fail "the archive has no logs/gpu_test.log"
  echo "no GPU: $(head -n 1 "$tmp/run/summary.txt")"
fi

rc=0; "$script" -C "$build" --budget-1 0 --only gpu_test -o "$tmp/budget" > "$tmp/budget.out" 2>&1 || rc=$?
[ "$rc" -eq 1 ] && grep -qF "not run: phase 1's 0s budget is spent" "$tmp/budget/summary.txt" ||
  { cat "$tmp/budget.out"; fail "a spent budget: exit $rc"; }

tiny="--model small --layers 1 --hidden 64 --heads 2 --seq 64 --seed 1"
rc=0; "$script" -C "$build" --device cpu --only train_cuda_3,losses_cpu_vs_cuda,train_llama_cuda_3 --train-args "$tiny" \
  --scratch "$tmp/scratch" -o "$tmp/cpu" > "$tmp/cpu.out" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || { cat "$tmp/cpu.out"; cat "$tmp/cpu/summary.txt" 2>/dev/null; fail "--device cpu: exit $rc"; }
grep -qF "20 steps, largest relative difference 0.00e+00, 0 outside 2e-2" "$tmp/cpu/summary.txt" ||
  { cat "$tmp/cpu/summary.txt"; fail "the loss comparison of two CPU runs"; }
grep -qF "relative difference 0.00e+00 (at most 1e-2)" "$tmp/cpu/summary.txt" || { cat "$tmp/cpu/summary.txt"; fail "eval at equal parameters"; }
[ ! -e "$tmp/scratch/nvme" ] && [ ! -e "$tmp/scratch/tmp" ] || fail "scratch files left behind"
echo "cpu: $(head -n 1 "$tmp/cpu/summary.txt")"
