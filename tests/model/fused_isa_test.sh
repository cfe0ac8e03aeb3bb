#!/usr/bin/env bash
# fused_isa_test.sh BASELINE AVX2 AVX512: the fused kernels built for three ISAs print the same
# hash of their outputs (see fused_isa_check.cpp). An ISA this CPU lacks is left out; with only
# the baseline left there is nothing to compare, and the test skips (exit 77).
set -euo pipefail
flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
want=$("$1")
echo "baseline x86-64: $want"
compared=0
for pair in "avx2:$2" "avx512f:$3"; do
  isa=${pair%%:*}
  exe=${pair#*:}
  if [[ " $flags " != *" $isa "* ]]; then
    echo "$isa: not on this CPU, skipped"
    continue
  fi
  got=$("$exe")
  echo "$isa: $got"
  if [[ $got != "$want" ]]; then
    echo "FAIL: the $isa build gives other bits than the baseline build" >&2
    exit 1
  fi
  compared=$((compared + 1))
done
[[ $compared -gt 0 ]] || exit 77
