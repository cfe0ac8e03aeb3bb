#!/usr/bin/env bash
# aio_bench's header line (stdout and summary.json "machine") says nothing about fio unless
# --vs-fio is given; with --vs-fio it names fio's version, or without fio on PATH the run fails
# with a message saying so. One point, one repeat, 10 ms runs on a 1 MiB file.
set -euo pipefail
bench=$1
tmp=$(mktemp -d "${ZINF_TEST_TMPDIR:-/tmp}/aio_bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/dir"
tiny=(--dir "$tmp/dir" --size 1M --block-sizes 1M --queue-depths 1 --parallelism 1 --single-submit false
      --overlap-events true --backends threads --ramp 0 --runtime 0.01 --repeats 1 --out-dir "$tmp/out")

"$bench" "${tiny[@]}" > "$tmp/plain.out" 2> "$tmp/plain.err" || { cat "$tmp/plain.out" "$tmp/plain.err"; exit 1; }
head=$(head -n 1 "$tmp/plain.out")
case "$head" in
  "zinf aio_bench |"*) ;;
  *) echo "not a header: $head"; exit 1 ;;
esac
# (The folder's name is left out of the check: a temporary name may contain "fio".)
if sed 's/| dir [^|]*|/|/' <<< "$head" | grep -qi fio; then echo "header mentions fio without --vs-fio: $head"; exit 1; fi
python3 - "$tmp/out/summary.json" "$head" <<'PY'
import json, sys
summary = json.load(open(sys.argv[1]))
assert summary["machine"] == sys.argv[2], (summary["machine"], sys.argv[2])
assert not any("fio" in key for key in summary), sorted(summary)
PY
echo "without --vs-fio: $head"

# Without fio on PATH: a clear error (aio_bench is started by its full path).
rc=0
PATH=/nonexistent "$bench" "${tiny[@]}" --vs-fio > "$tmp/nofio.out" 2>&1 || rc=$?
[ "$rc" -ne 0 ] || { echo "--vs-fio without fio succeeded:"; cat "$tmp/nofio.out"; exit 1; }
grep -qF -- "--vs-fio: fio is not installed" "$tmp/nofio.out" || { cat "$tmp/nofio.out"; exit 1; }
echo "--vs-fio without fio: $(cat "$tmp/nofio.out")"

if command -v fio > /dev/null; then
  version=$(fio --version)
  "$bench" "${tiny[@]}" --vs-fio > "$tmp/fio.out" 2> "$tmp/fio.err" || { cat "$tmp/fio.out" "$tmp/fio.err"; exit 1; }
  head=$(head -n 1 "$tmp/fio.out")
  [[ "$head" == *"| $version" ]] || { echo "header does not end with '| $version': $head"; exit 1; }
  echo "with --vs-fio: $head"
else
  echo "fio is not installed here: the --vs-fio header is not checked"
fi
