#!/usr/bin/env bash
# aio_bench --gpu and --gds on a machine without a usable GPU (or a build without the GPU layer):
# exit 2 with one line on stderr naming why, no traceback, and no file left in --dir. The CPU
# sweep's output is checked by aio_bench_header. On a machine with a GPU this test is skipped
# (exit 77): there the figures come from scripts/gpu-figures.
set -euo pipefail
bench=$1
tmp=$(mktemp -d "${ZINF_TEST_TMPDIR:-/tmp}/aio_bench_gpu.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/dir"
fail() { echo "FAIL: $*"; exit 1; }

for flag in --gpu --gds "--gpu --gds"; do
  rc=0
  # shellcheck disable=SC2086
  "$bench" $flag --dir "$tmp/dir" --size 4M --repeats 1 --ramp 0 --runtime 0.01 > "$tmp/out" 2> "$tmp/err" || rc=$?
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 3 ]; then
    echo "aio_bench $flag ran (a GPU is present): $(tail -n 3 "$tmp/out")"; exit 77
  fi
  [ "$rc" -eq 2 ] || { cat "$tmp/out" "$tmp/err"; fail "aio_bench $flag without a GPU: exit $rc, want 2"; }
  first=${flag%% *}
  line=$(grep "^aio_bench $first: " "$tmp/err" || true)
  [ -n "$line" ] || { cat "$tmp/err"; fail "aio_bench $flag: no 'aio_bench $first: ...' line on stderr"; }
  case "$line" in
    *"no CUDA device: "*|*"built without the GPU layer"*) ;;
    *) fail "aio_bench $flag: unclear reason: $line" ;;
  esac
  [ "$(grep -c "^aio_bench " "$tmp/err")" -eq 1 ] || { cat "$tmp/err"; fail "aio_bench $flag: more than one error line"; }
  [ -z "$(ls -A "$tmp/dir")" ] || fail "aio_bench $flag left files in --dir: $(ls "$tmp/dir")"
  echo "aio_bench $flag: exit 2, $line"
done
