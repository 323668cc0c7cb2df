#!/usr/bin/env bash
# Installs the Debian packages Terrace's build and tests need on a fresh
# machine: protoc (make generate) and PostgreSQL (the postgres state store's
# tests). Idempotent; quiet when everything is present.
set -euo pipefail

need=()
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || need+=(postgresql)
command -v git >/dev/null 2>&1 || need+=(git)

if [ ${#need[@]} -gt 0 ]; then
  echo "[deps] installing ${need[*]} from Debian's packages" >&2
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
