#!/usr/bin/env bash
# Runs the whole Go suite as two `go test` processes side by side: the
# end-to-end tier (test/e2e), which mostly waits on pods and tofu and is the
# longest package, starts at once; every other package runs beside it.
# One `go test ./...` would start test/e2e last (packages run in import-path
# order), after the CPU-bound unit tests, so the run would take their time
# plus the tier's. Both keep going when the other fails; the exit status is
# the first failure's.
#   hack/go-test.sh [GO TEST FLAGS...]     e.g. -count=1 -timeout 45m
set -uo pipefail
cd "$(dirname "$0")/.."

e2e=./test/e2e/
mapfile -t others < <(go list ./... | grep -v "/test/e2e$")

go test "$@" "$e2e" &
e2e_pid=$!
go test "$@" "${others[@]}"
others_rc=$?
wait "$e2e_pid"
e2e_rc=$?

[ "$others_rc" -eq 0 ] || { echo "go test: unit, envtest and other packages failed" >&2; exit "$others_rc"; }
[ "$e2e_rc" -eq 0 ] || { echo "go test: the end-to-end tier (test/e2e) failed" >&2; exit "$e2e_rc"; }
