#!/usr/bin/env bash
# Starts a throwaway PostgreSQL for tests, from Debian's packages
# (hack/install-deps.sh installs them when missing).
#
#   hack/postgres.sh start [DIR]   initdb into DIR (default: a new /tmp dir), start
#                                  the server on a unix socket in DIR, print
#                                  TERRACE_TEST_POSTGRES_URL=... and TERRACE_TEST_POSTGRES_DIR=...
#   hack/postgres.sh stop DIR      stop it and remove DIR
#
#   eval "$(hack/postgres.sh start)"; go test ./internal/state/...; hack/postgres.sh stop "$TERRACE_TEST_POSTGRES_DIR"
#
# TERRACE_POSTGRES_LISTEN=IP:PORT also listens on that TCP address (trusting
# every client that reaches it: give it an address only this machine's pods
# reach, such as the dev node's link) and prints TERRACE_TEST_POSTGRES_TCP_URL.
#
# TERRACE_POSTGRES_DURABLE=1 keeps PostgreSQL's crash safety (fsync,
# synchronous commit), which the test server otherwise turns off for speed.
#
# PostgreSQL refuses to run as root: as root the server runs as the
# "postgres" user the Debian package creates. It listens on no TCP port, only
# on a socket inside DIR (unless TERRACE_POSTGRES_LISTEN says otherwise), so
# several can run side by side.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
log() { echo "[postgres] $*" >&2; }

find_bin() {
  local d
  d="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
  if [ -z "$d" ] || [ ! -x "$d/postgres" ]; then
    log "PostgreSQL is not installed; installing it from Debian's packages"
    bash "$here/install-deps.sh"
    d="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
  fi
  [ -x "$d/postgres" ] || { log "no PostgreSQL server binary under /usr/lib/postgresql/*/bin"; exit 1; }
  echo "$d"
}

as_owner() {
  if [ "$(id -u)" -eq 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

cmd="${1:-start}"
case "$cmd" in
start)
  bin="$(find_bin)"
  dir="${2:-}"
  if [ -z "$dir" ]; then
    dir="$(mktemp -d /tmp/terrace-pg.XXXXXX)"
  fi
  mkdir -p "$dir"
  if [ "$(id -u)" -eq 0 ]; then
    id postgres >/dev/null 2>&1 || { log "running as root needs the 'postgres' user (the Debian package creates it)"; exit 1; }
    chown postgres: "$dir"
  fi
  chmod 700 "$dir"
  if [ ! -f "$dir/data/PG_VERSION" ]; then
    as_owner "$bin/initdb" -D "$dir/data" -U terrace -A trust -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 \
      || { cat "$dir/initdb.log" >&2; exit 1; }
  fi
  # The socket directory must be traversable by the (root) test process.
  chmod 711 "$dir"
  # Fast and not crash-safe, unless TERRACE_POSTGRES_DURABLE=1: a crash
  # (pg_ctl stop -m immediate) then loses acknowledged commits, which only
  # the chaos harness's restart cares about.
  durability="-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
  if [ "${TERRACE_POSTGRES_DURABLE:-}" = 1 ]; then
    durability=""
  fi
  listen="-c listen_addresses=''" port=5432
  if [ -n "${TERRACE_POSTGRES_LISTEN:-}" ]; then
    port="${TERRACE_POSTGRES_LISTEN##*:}"
    listen="-c listen_addresses=${TERRACE_POSTGRES_LISTEN%:*} -p $port"
    grep -q '^host all all 0.0.0.0/0 trust' "$dir/data/pg_hba.conf" \
      || echo 'host all all 0.0.0.0/0 trust' >>"$dir/data/pg_hba.conf"
  fi
  as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
    -o "-k $dir $listen $durability -c max_connections=200" \
    start >/dev/null || { cat "$dir/server.log" >&2; exit 1; }
  if ! as_owner "$bin/psql" -h "$dir" -p "$port" -U terrace -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname='terrace'" | grep -q 1; then
    as_owner "$bin/createdb" -h "$dir" -p "$port" -U terrace terrace
  fi
  echo "TERRACE_TEST_POSTGRES_URL='postgres://terrace@/terrace?host=$dir&port=$port&sslmode=disable'"
  if [ -n "${TERRACE_POSTGRES_LISTEN:-}" ]; then
    echo "TERRACE_TEST_POSTGRES_TCP_URL='postgres://terrace@$TERRACE_POSTGRES_LISTEN/terrace?sslmode=disable'"
  fi
  echo "TERRACE_TEST_POSTGRES_DIR='$dir'"
  ;;
stop)
  dir="${2:?usage: hack/postgres.sh stop DIR}"
  bin="$(find_bin)"
  if [ -f "$dir/data/postmaster.pid" ]; then
    as_owner "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
  fi
  case "$dir" in
  /tmp/terrace-pg.*) rm -rf "$dir" ;;
  *) log "left $dir in place (not created by this script)" ;;
  esac
  ;;
*)
  echo "usage: hack/postgres.sh start [DIR] | stop DIR" >&2
  exit 2
  ;;
esac
