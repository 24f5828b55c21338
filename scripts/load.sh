#!/usr/bin/env bash
# The suite under load: two busy loops keep both cores busy while the whole suite runs N times
# in a row (default 5); stops at the first red run. Each run's result and wall time are printed
# with the load average, and a summary at the end.
#   bash scripts/load.sh [N] [pytest arguments...]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
shift || true
bash scripts/setup.sh >/dev/null
export QE_SETUP_DONE=1 CI=true

busy=()
stop_busy() { [ "${#busy[@]}" -eq 0 ] || kill "${busy[@]}" 2>/dev/null || true; }
trap stop_busy EXIT
for _ in 1 2; do
  (while :; do :; done) &
  busy+=($!)
done
echo "load: busy loops ${busy[*]} on $(nproc) cores; $runs runs"

passed=0
for run in $(seq "$runs"); do
  started=$SECONDS
  if bash scripts/test.sh -q -p no:cacheprovider "$@" >"${TMPDIR:-/tmp}/qe-load-run-$run.log" 2>&1; then
    result=passed
    passed=$((passed + 1))
  else
    result=FAILED
  fi
  printf 'load: run %d/%d %s in %d s (load average %s); %s\n' "$run" "$runs" "$result" \
    $((SECONDS - started)) "$(cut -d' ' -f1-3 /proc/loadavg)" "$(tail -n1 "${TMPDIR:-/tmp}/qe-load-run-$run.log")"
  [ "$result" = passed ] || break
done
echo "load: $passed of $runs runs passed in a row"
[ "$passed" -eq "$runs" ]
