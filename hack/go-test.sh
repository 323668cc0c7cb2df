#!/usr/bin/env bash
# Runs the whole Go suite as two `go test` processes side by side: the
# end-to-end tier (test/e2e), which mostly waits on pods and tofu and is the
# longest package, starts at once; every other package runs beside it.
# One `go test ./...` would start test/e2e last (packages run in import-path
# order), after the CPU-bound unit tests, so the run would take their time
# plus the tier's. Both keep going when the other fails; the exit status is
# the first failure's.
#
# The tier runs verbose into bin/e2e-test.log; the terminal gets each test's
# result, the ten slowest tests, and the log's end when the tier fails.
#   hack/go-test.sh [GO TEST FLAGS...]     e.g. -count=1 -timeout 45m
set -uo pipefail
cd "$(dirname "$0")/.."

e2e=./test/e2e/
e2e_log=bin/e2e-test.log
mkdir -p bin
mapfile -t others < <(go list ./... | grep -v "/test/e2e$")

go test -v "$@" "$e2e" >"$e2e_log" 2>&1 &
e2e_pid=$!
go test "$@" "${others[@]}"
others_rc=$?
wait "$e2e_pid"
e2e_rc=$?

grep -E '^(--- (FAIL|SKIP)|FAIL|ok|panic)' "$e2e_log"
echo "end-to-end tests: $(grep -c '^--- PASS' "$e2e_log") passed, $(grep -c '^--- FAIL' "$e2e_log") failed; slowest:"
sed -nE 's/^--- (PASS|FAIL): ([^ ]+) \(([0-9.]+)s\)$/\3 \2/p' "$e2e_log" | sort -rn | head -10 | awk '{printf "  %7.1fs %s\n", $1, $2}'
if [ "$e2e_rc" -ne 0 ]; then
  echo "--- the end of $e2e_log:"
  tail -n 300 "$e2e_log"
fi

[ "$others_rc" -eq 0 ] || { echo "go test: unit, envtest and other packages failed" >&2; exit "$others_rc"; }
[ "$e2e_rc" -eq 0 ] || { echo "go test: the end-to-end tier (test/e2e) failed (whole log: $e2e_log)" >&2; exit "$e2e_rc"; }
