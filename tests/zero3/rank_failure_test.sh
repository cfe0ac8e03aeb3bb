#!/usr/bin/env bash
# One failing rank of `mpirun -np 2 zinf train` ends the whole job promptly, with a non-zero
# status, instead of leaving the other rank waiting (for --comm-timeout, or for ever):
#  (a) rank 1 is SIGKILLed a few steps into a run that would take minutes: the job must end
#      within 60 s of the kill (mpirun sees the dead rank, or rank 0's collective fails and
#      zinf train aborts the job);
#  (b) rank 1 runs fewer --steps and exits cleanly: rank 0's next collective times out after
#      --comm-timeout 10 s with the communicator's "did not complete within" error, and zinf
#      train aborts the job; it must end within 60 s of the start (10 s of it the timeout);
#  (c) rank 1 fails with an error (--resume from a missing folder) while rank 0, with the
#      default 300 s --comm-timeout, waits in its first step: only zinf train's abort of the
#      job can end it within 60 s, and the status is the failed rank's (2: not found).
set -euo pipefail
zinf=$1
tmp=$(mktemp -d "${ZINF_TEST_TMPDIR:-/tmp}/rank_failure.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export ZINF_LOG_LEVEL=warning
# The outer timeout only keeps a broken build from hanging the suite; the bounds are below.
mpirun=(timeout -s KILL 150 mpirun --allow-run-as-root --oversubscribe --bind-to none)
cat > "$tmp/ds.json" <<JSON
{"train_batch_size": 8, "gradient_accumulation_steps": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
 "zero_optimization": {"stage": 3}}
JSON
train=("$zinf" train --config "$tmp/ds.json" --model tiny --comm-timeout 10)
bound=60

# (a) Rank 1 runs under sh, which waits until rank 0 has logged a step (so both ranks are in
# the training loop), lets it run 2 s more, notes the time and SIGKILLs zinf.
rank1_killer='
  tmp=$1; shift
  "$@" & pid=$!
  for _ in $(seq 600); do [ -s "$tmp/a.jsonl" ] && break; sleep 0.1; done
  sleep 2
  date +%s > "$tmp/killed"
  kill -KILL $pid
  wait $pid
  exit 137'
set +e
"${mpirun[@]}" -np 1 "${train[@]}" --steps 100000 --json-log "$tmp/a.jsonl" : \
  -np 1 sh -c "$rank1_killer" sh "$tmp" "${train[@]}" --steps 100000 > "$tmp/out_a" 2>&1
rc=$?
set -e
end=$(date +%s)
if [ ! -s "$tmp/killed" ]; then echo "(a) rank 1 was never killed:"; tail -c 3000 "$tmp/out_a"; exit 1; fi
elapsed=$((end - $(cat "$tmp/killed")))
steps=$(wc -l < "$tmp/a.jsonl")
echo "(a) rank 1 SIGKILLed after rank 0 logged $steps steps: job ended with status $rc, $elapsed s after the kill (bound $bound s)"
if [ "$rc" -eq 0 ]; then echo "(a) the job exited 0 although rank 1 was killed:"; tail -c 3000 "$tmp/out_a"; exit 1; fi
if [ "$elapsed" -gt "$bound" ]; then echo "(a) took $elapsed s > $bound s after the kill:"; tail -c 3000 "$tmp/out_a"; exit 1; fi

# (b) Rank 1 stops after 3 steps; rank 0 wants 100000.
start=$(date +%s)
set +e
"${mpirun[@]}" -np 1 "${train[@]}" --steps 100000 : -np 1 "${train[@]}" --steps 3 > "$tmp/out_b" 2>&1
rc=$?
set -e
elapsed=$(( $(date +%s) - start ))
echo "(b) rank 1 exited after 3 steps: job ended with status $rc after $elapsed s in all (bound $bound s, comm timeout 10 s)"
if [ "$rc" -eq 0 ]; then echo "(b) the job exited 0:"; tail -c 3000 "$tmp/out_b"; exit 1; fi
if [ "$elapsed" -gt "$bound" ]; then echo "(b) took $elapsed s > $bound s:"; tail -c 3000 "$tmp/out_b"; exit 1; fi
if ! grep -q "zinf train: rank 0: .*did not complete within 10 s" "$tmp/out_b"; then
  echo "(b) rank 0 did not report the communicator's timeout:"; tail -c 3000 "$tmp/out_b"; exit 1
fi
grep "zinf train: rank 0:" "$tmp/out_b"

# (c) Rank 1 fails after the communicator exists; rank 0 keeps the default timeout.
start=$(date +%s)
set +e
"${mpirun[@]}" -np 1 "$zinf" train --config "$tmp/ds.json" --model tiny --steps 100000 : \
  -np 1 "$zinf" train --config "$tmp/ds.json" --model tiny --steps 100000 --resume "$tmp/missing" > "$tmp/out_c" 2>&1
rc=$?
set -e
elapsed=$(( $(date +%s) - start ))
echo "(c) rank 1 failed to resume: job ended with status $rc after $elapsed s (bound $bound s, comm timeout 300 s)"
if [ "$rc" -ne 2 ]; then echo "(c) expected status 2 (not found):"; tail -c 3000 "$tmp/out_c"; exit 1; fi
if [ "$elapsed" -gt "$bound" ]; then echo "(c) took $elapsed s > $bound s:"; tail -c 3000 "$tmp/out_c"; exit 1; fi
if ! grep -q "zinf train: rank 1: --resume.*$tmp/missing" "$tmp/out_c"; then
  echo "(c) rank 1 did not report its error:"; tail -c 3000 "$tmp/out_c"; exit 1
fi
echo "rank_failure_test: one failed rank ends the job"
