#!/usr/bin/env bash
# scripts/bundle: bundles programs, unpacks the tarball elsewhere and runs them through its
# launcher with a clean environment: every library but glibc and CUDA's must resolve inside the
# bundle; the CUDA libraries are found on this machine (ldconfig, CUDA folders, or a Python
# site-packages nvidia/*/lib); a missing one is a clear error. Where a mount namespace can be had
# (unshare), the original copies of the bundled libraries are hidden (/dev/null bound over them)
# and the programs must still run.
#   bundle_test.sh BUNDLE_SCRIPT GPU_TEST ZINF AIO_BENCH
set -euo pipefail

if [ "${1:-}" = "--hidden" ]; then
  # Inside the mount namespace: hide every bundled library's original, then run through the launcher.
  b=$2 scratch=$3
  while read -r soname arrow original; do
    [ "$arrow" = "<-" ] || continue
    mount --bind /dev/null "$original"
  done < <(sed -n '/^bundled libraries:/,/^CUDA libraries/p' "$b/MANIFEST")
  # The control: without the launcher the loader finds only the (now empty) originals of libfmt
  # and libstdc++, so gpu_test cannot start.
  if env -i PATH=/usr/bin:/bin "$b/bin/gpu_test" --gtest_list_tests > "$scratch/plain.txt" 2>&1; then
    echo "FAIL: gpu_test started without the launcher although its libraries are hidden"; exit 1
  fi
  env -i PATH=/usr/bin:/bin HOME=/tmp "$b/run" --check
  env -i PATH=/usr/bin:/bin HOME=/tmp "$b/run" zinf --help > /dev/null
  env -i PATH=/usr/bin:/bin HOME=/tmp "$b/run" aio_bench --help > /dev/null
  env -i PATH=/usr/bin:/bin HOME=/tmp "$b/run" gpu_test --gtest_brief=1
  echo "hidden originals: ok"
  exit 0
fi

bundle=$1 gpu_test=$2 zinf=$3 aio_bench=$4
tmp=$(mktemp -d "${ZINF_TEST_TMPDIR:-/tmp}/bundle.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
clean=(env -i PATH=/usr/bin:/bin HOME="$tmp")

# Uncompressed: the test is about what is inside; compression is checked on a small bundle below.
"$bundle" -o "$tmp/b.tar" -n zb -c none "$gpu_test" "$zinf" "$aio_bench"
mkdir "$tmp/unpacked"
tar -C "$tmp/unpacked" -xf "$tmp/b.tar"
b="$tmp/unpacked/zb"
[ -x "$b/run" ] || fail "no launcher in the bundle"
for p in gpu_test zinf aio_bench; do [ -x "$b/bin/$p" ] || fail "bin/$p missing"; done
[ "$("${clean[@]}" "$b/run" --list | tr '\n' ' ')" = "aio_bench gpu_test zinf " ] || fail "--list: $("$b/run" --list)"

# What was bundled: zinf's own and third-party libraries, never glibc or CUDA.
for lib in libzinf.so libfmt.so.9 libopenblas.so.0 libdnnl.so.2 libxxhash.so.0; do
  [ -f "$b/lib/$lib" ] || fail "lib/$lib missing: $(ls "$b/lib")"
done
[ -f "$b/lib/cxx/libstdc++.so.6" ] || fail "lib/cxx/libstdc++.so.6 missing"
if ls "$b/lib" "$b/lib/cxx" | grep -E '^(libc\.so|libm\.so|ld-linux|libpthread|libdl\.so|libcudart|libcublas|libnccl|libcuda\.so)'; then
  fail "glibc or CUDA libraries were bundled"
fi
grep -qx 'libcudart.so.13' "$b/cuda-libs.txt" || fail "cuda-libs.txt: $(cat "$b/cuda-libs.txt")"
grep -qx 'libcublas.so.13' "$b/cuda-libs.txt" || fail "cuda-libs.txt lacks libcublas.so.13"
grep -q '^GLIBC_NEEDED=2\.' "$b/requirements.txt" || fail "requirements.txt: $(cat "$b/requirements.txt")"

# ldd through the launcher: everything resolves; all but glibc's and CUDA's from the bundle.
check_ldd() {  # program
  local listing soname path
  listing=$("${clean[@]}" "$b/run" --ldd "$1")
  if grep -q "not found" <<< "$listing"; then fail "ldd $1 through the launcher: $listing"; fi
  while read -r soname _ path _; do
    case "$soname" in
      libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|ld-linux*|linux-vdso*|/*) continue ;;
      libcuda*|libcublas*|libnccl*) [ -e "$path" ] || fail "$1: $soname -> $path"; continue ;;
      # This machine's C++ runtime when it is new enough (the launcher checks), else lib/cxx.
      libstdc++.so.*|libgcc_s.so.*) [ -e "$path" ] || fail "$1: $soname -> $path"; continue ;;
    esac
    case "$path" in
      "$b"/lib/*) ;;
      *) fail "$1: $soname resolves outside the bundle: $path" ;;
    esac
  done <<< "$listing"
}
for p in zinf aio_bench gpu_test; do check_ldd "$p"; done

# The launcher finds this machine's CUDA libraries, and the GPU tests run (they skip without a GPU).
"${clean[@]}" "$b/run" --check > "$tmp/check.txt" || fail "--check: $(cat "$tmp/check.txt")"
grep -q '^libcudart.so.13: /' "$tmp/check.txt" || fail "--check: $(cat "$tmp/check.txt")"
"${clean[@]}" "$b/run" gpu_test --gtest_brief=1 > "$tmp/gpu_test.txt" 2>&1 || { cat "$tmp/gpu_test.txt"; fail "gpu_test"; }
"${clean[@]}" "$b/run" zinf --help > /dev/null || fail "zinf --help through the launcher"
"${clean[@]}" "$b/run" --tests --gtest_brief=1 > "$tmp/tests.txt" 2>&1 || { cat "$tmp/tests.txt"; fail "--tests"; }
grep -q '^=== 1 passed, 0 failed' "$tmp/tests.txt" || fail "--tests summary: $(tail -n 1 "$tmp/tests.txt")"

# Only in a Python site-packages folder, as PyTorch's nvidia-* wheels install them.
sp="$tmp/site-packages"
while read -r soname; do
  path=$(sed -n "s|^$soname: \(/[^ ]*\) .*|\1|p" "$tmp/check.txt")
  [ -n "$path" ] || fail "--check did not locate $soname"
  mkdir -p "$sp/nvidia/fake_${soname%%.so*}/lib"
  ln -s "$(readlink -f "$path")" "$sp/nvidia/fake_${soname%%.so*}/lib/$soname"
done < "$b/cuda-libs.txt"
mkdir "$tmp/fakebin"
printf '#!/bin/sh\necho %s\n' "$sp" > "$tmp/fakebin/python3"
chmod +x "$tmp/fakebin/python3"
py_env=(env -i PATH="$tmp/fakebin:/usr/bin:/bin" HOME="$tmp" ZINF_CUDA_LOOKUP=python ZINF_PYTHON=python3)
"${py_env[@]}" "$b/run" --check > "$tmp/check_py.txt" || fail "--check (python): $(cat "$tmp/check_py.txt")"
grep -q "^libcudart.so.13: $sp/nvidia/fake_libcudart/lib/libcudart.so.13 (python)" "$tmp/check_py.txt" ||
  fail "python lookup: $(cat "$tmp/check_py.txt")"
"${py_env[@]}" "$b/run" --ldd gpu_test > "$tmp/ldd_py.txt"
grep -q "libcudart.so.13 => $sp/nvidia/fake_libcudart/lib/" "$tmp/ldd_py.txt" || fail "ldd with the python lookup: $(cat "$tmp/ldd_py.txt")"
"${py_env[@]}" "$b/run" gpu_test --gtest_brief=1 > /dev/null 2>&1 || fail "gpu_test with the python lookup"

# Nowhere to be found: --check and running say which library is missing.
none_env=(env -i PATH=/usr/bin:/bin HOME="$tmp" ZINF_CUDA_LOOKUP=env ZINF_CUDA_LIB_PATH="$tmp/nothing")
if "${none_env[@]}" "$b/run" --check > "$tmp/check_none.txt"; then fail "--check passed without CUDA libraries"; fi
grep -q '^libcudart.so.13: MISSING' "$tmp/check_none.txt" || fail "$(cat "$tmp/check_none.txt")"
if "${none_env[@]}" "$b/run" gpu_test > /dev/null 2> "$tmp/run_none.txt"; then fail "ran without CUDA libraries"; fi
grep -q 'CUDA libraries not found: .*libcudart.so.13' "$tmp/run_none.txt" || fail "$(cat "$tmp/run_none.txt")"
if "${clean[@]}" "$b/run" no_such_program 2> "$tmp/err.txt"; then fail "ran a program that is not bundled"; fi
grep -q "no program 'no_such_program'" "$tmp/err.txt" || fail "$(cat "$tmp/err.txt")"

# Compressed, as shipped.
"$bundle" -o "$tmp/small.tar.gz" -n small -c gzip "$gpu_test" > /dev/null
tar -tzf "$tmp/small.tar.gz" > "$tmp/small.txt"
grep -qx 'small/run' "$tmp/small.txt" || fail "small bundle lacks its launcher: $(cat "$tmp/small.txt")"
grep -qx 'small/bin/gpu_test' "$tmp/small.txt" || fail "small bundle lacks gpu_test"

# The originals hidden, where a private mount namespace can be had.
if unshare -m true 2>/dev/null; then
  unshare -m "$0" --hidden "$b" "$tmp" > "$tmp/hidden.txt" 2>&1 || { cat "$tmp/hidden.txt"; fail "with the originals hidden"; }
  grep -q '^libstdc++: the bundled one' "$tmp/hidden.txt" || fail "hidden libstdc++ not replaced: $(cat "$tmp/hidden.txt")"
  echo "bundle: ok, also with the originals of the bundled libraries hidden"
else
  echo "bundle: ok (no mount namespace here: originals not hidden; ldd through the launcher checked instead)"
fi
