#!/usr/bin/env bash
# Installs the built libzinf into a temporary prefix and builds examples/consumer and
# examples/mlp (a user-defined model trained with ZeRO-3 and NVMe offload) against it with Meson
# and with CMake through pkg-config, then runs the programs.
set -euo pipefail
src=$1 build=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/zinf-consumer.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

meson install -C "$build" --no-rebuild --destdir "$tmp/dest" >"$tmp/install.log" 2>&1 \
  || { cat "$tmp/install.log"; exit 1; }
pc=$(find "$tmp/dest" -name zinf.pc | head -n 1)
[ -n "$pc" ] || { echo "consumer_test: zinf.pc was not installed"; exit 1; }
prefix=$(sed -n 's/^prefix=//p' "$pc")
# Point the installed .pc at the relocated prefix.
sed -i "s|^prefix=.*|prefix=$tmp/dest$prefix|" "$pc"
export PKG_CONFIG_PATH=$(dirname "$pc")
libdir=$(pkg-config --variable=libdir zinf)
export LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

meson setup "$tmp/meson-build" "$src/examples/consumer" >"$tmp/meson.log" 2>&1 \
  || { cat "$tmp/meson.log"; exit 1; }
ninja -C "$tmp/meson-build" >"$tmp/ninja.log" 2>&1 || { cat "$tmp/ninja.log"; exit 1; }
"$tmp/meson-build/consumer" "$tmp/meson.bin"

cmake -S "$src/examples/consumer" -B "$tmp/cmake-build" >"$tmp/cmake.log" 2>&1 \
  || { cat "$tmp/cmake.log"; exit 1; }
cmake --build "$tmp/cmake-build" >"$tmp/cmake-build.log" 2>&1 || { cat "$tmp/cmake-build.log"; exit 1; }
"$tmp/cmake-build/consumer" "$tmp/cmake.bin"
# The user-defined model: built both ways; the Meson build trains it (exit 0 = the loss fell),
# the CMake build runs a few steps.
meson setup "$tmp/mlp-meson" "$src/examples/mlp" >"$tmp/mlp-meson.log" 2>&1 || { cat "$tmp/mlp-meson.log"; exit 1; }
ninja -C "$tmp/mlp-meson" >"$tmp/mlp-ninja.log" 2>&1 || { cat "$tmp/mlp-ninja.log"; exit 1; }
mkdir -p "$tmp/mlp-swap" "$tmp/mlp-swap-cmake"
"$tmp/mlp-meson/mlp_example" "$tmp/mlp-swap" 60
test -s "$tmp/mlp-swap/token_mlp.safetensors" || { echo "consumer_test: no consolidated safetensors"; exit 1; }
cmake -S "$src/examples/mlp" -B "$tmp/mlp-cmake" >"$tmp/mlp-cmake.log" 2>&1 || { cat "$tmp/mlp-cmake.log"; exit 1; }
cmake --build "$tmp/mlp-cmake" >"$tmp/mlp-cmake-build.log" 2>&1 || { cat "$tmp/mlp-cmake-build.log"; exit 1; }
"$tmp/mlp-cmake/mlp_example" "$tmp/mlp-swap-cmake" 60
echo "consumer_test: Meson and CMake consumers (aio round trip, user-defined model) built and ran against the installed libzinf"
