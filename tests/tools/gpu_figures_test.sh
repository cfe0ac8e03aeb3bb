#!/usr/bin/env bash
# scripts/gpu-figures on this machine: --dry-run lists every figure's command; a real run without a
# usable GPU stops after the probe with exit 2, a "no GPU: ..." line and a summary.txt saying so.
# Then the same from a bundle (scripts/bundle -c none with gpu_copy_bench): the bundle carries
# ./gpu-figures and share/gpu, and its run stops the same way (or at ./run --check). On a machine
# with a GPU the test is skipped (exit 77): the script's run there is the figures themselves.
set -euo pipefail
script=$1 bundle=$2 build=$3
[ -x "$build/bench/gpu_copy_bench" ] || { echo "no $build/bench/gpu_copy_bench (benchmarks off)"; exit 77; }
tmp=$(mktemp -d "${ZINF_TEST_TMPDIR:-/tmp}/gpu_figures.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$script" -C "$build" --dry-run -o "$tmp/dry" > "$tmp/dry.out" 2>&1 || { cat "$tmp/dry.out"; fail "--dry-run failed"; }
for want in "gpu_copy_bench --json" "aio_bench --gpu" "--gds" "gpu_memory_test" "gpu_kernels_test" "gpu_model_test" \
            "train --device cuda" "--model gpt2 --vocab 50257" "--model 1.3b" "a_gpt2_gpu.json" \
            "b_1p3b_offload_cpu.json" "c_nvme_offload.json"; do
  grep -qF -- "$want" "$tmp/dry.out" || { cat "$tmp/dry.out"; fail "--dry-run does not list '$want'"; }
done
[ ! -e "$tmp/dry" ] || fail "--dry-run created its output folder"
echo "dry run: $(grep -c '^  \[' "$tmp/dry.out") commands"

rc=0
"$script" -C "$build" -o "$tmp/run" > "$tmp/run.out" 2>&1 || rc=$?
if ! grep -q '^gpu-figures: no GPU: ' "$tmp/run.out"; then
  if [ "$rc" -ne 2 ] && command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; then
    echo "a GPU is present: not checked here"; exit 77
  fi
  cat "$tmp/run.out"; fail "no 'gpu-figures: no GPU: ...' line (exit $rc)"
fi
[ "$rc" -eq 2 ] || fail "without a GPU: exit $rc, want 2"
grep -q '^gpu-figures: no GPU: ' "$tmp/run/summary.txt" || fail "summary.txt does not say why"
[ ! -e "$tmp/run/nvme" ] || fail "the NVMe folder was left behind"
echo "build run: $(grep '^gpu-figures:' "$tmp/run.out")"

"$bundle" -c none -n figs -o "$tmp/figs.tar" "$build/bench/gpu_copy_bench" > "$tmp/bundle.out" 2>&1 ||
  { cat "$tmp/bundle.out"; fail "scripts/bundle failed"; }
tar -C "$tmp" -xf "$tmp/figs.tar"
[ -x "$tmp/figs/gpu-figures" ] || fail "the bundle has no ./gpu-figures"
[ -f "$tmp/figs/share/gpu/c_nvme_offload.json" ] || fail "the bundle has no share/gpu ds_configs"
(cd "$tmp/figs" && ./gpu-figures --dry-run -o "$tmp/bdry") > "$tmp/bdry.out" 2>&1 || { cat "$tmp/bdry.out"; fail "bundle --dry-run"; }
grep -qF "$tmp/figs/run gpu_copy_bench" "$tmp/bdry.out" || { cat "$tmp/bdry.out"; fail "bundle --dry-run does not go through ./run"; }
rc=0
(cd "$tmp/figs" && ./gpu-figures -o "$tmp/brun") > "$tmp/brun.out" 2>&1 || rc=$?
[ "$rc" -eq 2 ] || { cat "$tmp/brun.out"; fail "bundle run without a GPU: exit $rc, want 2"; }
grep -qE '^gpu-figures: (no GPU: |./run --check failed)' "$tmp/brun.out" || { cat "$tmp/brun.out"; fail "bundle run: unclear stop"; }
echo "bundle run: $(grep '^gpu-figures:' "$tmp/brun.out")"

# A bundle without the probe's program says so, not "no GPU".
"$bundle" -c none -n noprobe -o "$tmp/noprobe.tar" "$build/tools/aio_bench/aio_bench" > "$tmp/bundle2.out" 2>&1 ||
  { cat "$tmp/bundle2.out"; fail "scripts/bundle (aio_bench) failed"; }
tar -C "$tmp" -xf "$tmp/noprobe.tar"
rc=0
(cd "$tmp/noprobe" && ./gpu-figures -o "$tmp/nrun") > "$tmp/nrun.out" 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -qF "cannot probe the GPU: this bundle has no gpu_copy_bench" "$tmp/nrun.out" ||
  { cat "$tmp/nrun.out"; fail "a bundle without gpu_copy_bench: exit $rc, unclear"; }
[ -x "$tmp/noprobe/gpu-check" ] || fail "the bundle has no ./gpu-check"
