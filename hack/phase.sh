#!/usr/bin/env bash
# Times one phase of a make target and records it, so that `.ci/run` can
# print where a run's time went, whether it passed or not:
#   hack/phase.sh NAME COMMAND [ARGS...]   run COMMAND, append "NAME SECONDS EXIT" to the record
#   hack/phase.sh --summary                print the record as a table
# The record is $TERRACE_PHASES_FILE; without it, phases run untimed.
set -uo pipefail

record=${TERRACE_PHASES_FILE:-}
if [ "${1:-}" = "--summary" ]; then
  [ -n "$record" ] && [ -s "$record" ] || exit 0
  total=0
  echo "phase            time     result"
  while read -r name secs rc; do
    total=$((total + secs))
    printf '%-16s %3dm%02ds  %s\n' "$name" $((secs / 60)) $((secs % 60)) "$([ "$rc" = 0 ] && echo ok || echo "failed ($rc)")"
  done <"$record"
  printf '%-16s %3dm%02ds\n' total $((total / 60)) $((total % 60))
  exit 0
fi

name=${1:?usage: phase.sh NAME COMMAND [ARGS...]}
shift
start=$SECONDS
"$@"
rc=$?
[ -n "$record" ] && echo "$name $((SECONDS - start)) $rc" >>"$record"
exit $rc
