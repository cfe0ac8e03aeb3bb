#!/usr/bin/env bash
# Every real-world config users would expect to run does: each file under data/real (copied
# unchanged from LLaMA-Factory, LLaVA, axolotl, FastChat, accelerate, BigScience, Stanford Alpaca;
# see data/real/SOURCES.md) and the
# Hugging Face test configs pass `zinf config check` (with --steps and without, as zinf train's
# default --steps fills an "auto" total_num_steps) and train two steps of a tiny model, their
# "auto" values filled by the Hugging Face Trainer's defaults (one note line each). With
# --strict-auto the same files fail with the options to pass. (The NVMe examples name a
# /local_nvme folder the user replaces, and hf_zero2_missing_comma.json is broken on purpose:
# config_test covers them.)
set -euo pipefail
zinf=$1 data=$2
tmp=$(mktemp -d "${ZINF_TEST_TMPDIR:-/tmp}/real_configs.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export ZINF_LOG_LEVEL=notice
n=0
for f in "$data"/real/*.json "$data"/hf_zero2_auto.json "$data"/hf_zero3_auto.json "$data"/hf_zero3_legacy.json \
         "$data"/ds_config_json_page.json "$data"/ds_zero3_offload.json; do
  name=$(basename "$f")
  "$zinf" config check "$f" --model tiny --steps 2 > "$tmp/check.out" 2>&1 \
    || { echo "$name: zinf config check failed:"; cat "$tmp/check.out"; exit 1; }
  # As zinf train without --steps resolves it (its default fills an "auto" total_num_steps).
  "$zinf" config check "$f" --model tiny > "$tmp/check_default.out" 2>&1 \
    || { echo "$name: zinf config check without --steps failed:"; cat "$tmp/check_default.out"; exit 1; }
  "$zinf" train --config "$f" --model tiny --steps 2 > "$tmp/train.out" 2>&1 \
    || { echo "$name: zinf train failed:"; cat "$tmp/train.out"; exit 1; }
  grep -q "^done: 2 steps" "$tmp/train.out" || { echo "$name: no 'done' line"; cat "$tmp/train.out"; exit 1; }
  notes=$(grep -c "Hugging Face Trainer's default" "$tmp/check.out" || true)
  echo "real_configs_test: $name runs ($notes Trainer defaults noted)"
  n=$((n + 1))
done
set +e
"$zinf" config check "$data/real/llamafactory_ds_z3_config.json" --model tiny --strict-auto > "$tmp/strict.out" 2>&1
status=$?
set -e
[ "$status" -eq 2 ] || { echo "--strict-auto: exit $status, expected 2"; cat "$tmp/strict.out"; exit 1; }
grep -q -- "--micro-batch" "$tmp/strict.out" || { echo "--strict-auto does not name --micro-batch"; cat "$tmp/strict.out"; exit 1; }
echo "real_configs_test: $n configs run; --strict-auto refuses unfilled autos"
