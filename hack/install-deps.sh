#!/usr/bin/env bash
# Installs the Debian packages a make target needs on a fresh machine, and
# nothing when they are present (idempotent, silent then). The Makefile calls
# it first in `make test` and `make demo`, so neither needs a set-up step.
#
#   hack/install-deps.sh test   protoc (make generate/verify), PostgreSQL (the
#                               postgres store's tests), git (also copied,
#                               with its libraries, into the end-to-end tests'
#                               Gitea image), chromium (the console's browser
#                               tests, driven by chromedp), a static busybox
#                               (the shell the end-to-end tests' images give
#                               local-exec provisioners and Gitea's hooks)
#   hack/install-deps.sh demo   git (version stamping), and what the dev
#                               cluster's node runs besides the binaries `make
#                               tools` builds from Go modules: runc (containers),
#                               nftables (kube-proxy's and the node's rules),
#                               iproute2 and util-linux's nsenter (the node's
#                               namespaces). `test` installs these too.
#
# TERRACE_DEPS_DRY_RUN=1 prints the packages it would install and installs none.
set -euo pipefail

profile=${1:-test}
need=()
command -v git >/dev/null 2>&1 || need+=(git)
# The dev cluster's node (demo and the end-to-end tests).
[ -x /usr/sbin/runc ] || command -v runc >/dev/null 2>&1 || need+=(runc)
command -v nft >/dev/null 2>&1 || [ -x /usr/sbin/nft ] || need+=(nftables)
command -v ip >/dev/null 2>&1 || [ -x /usr/sbin/ip ] || need+=(iproute2)
command -v nsenter >/dev/null 2>&1 || [ -x /usr/bin/nsenter ] || need+=(util-linux)
case "$profile" in
  test)
    command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
    compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null || need+=(postgresql)
    command -v chromium >/dev/null 2>&1 || need+=(chromium)
    [ -e /usr/share/doc/busybox-static ] || need+=(busybox-static)
    ;;
  demo) ;;
  *) echo "install-deps.sh: unknown profile '$profile' (want test or demo)" >&2; exit 2 ;;
esac

[ ${#need[@]} -eq 0 ] && exit 0
if [ -n "${TERRACE_DEPS_DRY_RUN:-}" ]; then
  echo "${need[*]}"
  exit 0
fi

echo "[deps] installing ${need[*]} from Debian's packages (make $profile needs them)" >&2
sudo=""
[ "$(id -u)" -ne 0 ] && sudo=sudo
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
