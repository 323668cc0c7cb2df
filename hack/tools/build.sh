#!/usr/bin/env bash
# Builds the binaries Terrace's tests and `terrace dev` need, from Go modules
# only, into a cache outside the checkout keyed by tool and version: the
# control plane (etcd, kube-apiserver, kube-controller-manager, kubectl), the
# dev cluster's node (kubelet, kube-scheduler, kube-proxy, containerd and its
# runc shim, the CNI plugins, CoreDNS, the pause process), tofu, and for the
# end-to-end test of Flux sources, Flux's source-controller with its CRDs and
# our git server (hack/tools/gitserver), and for the Git loop's tests a Gitea
# server with the templates, options and public files it reads beside it:
#   ${TERRACE_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/terrace/tools}/<name>-<version>/<name>
# What exists is skipped; binaries the user already has are honoured
# (KUBEBUILDER_ASSETS for the control plane, `tofu` on PATH).
# Prints the directory of each tool on its last lines, as NAME=path, for the Makefile.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${TERRACE_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/terrace/tools}
mkdir -p "$cache"

ETCD_VERSION=v3.6.16
KUBERNETES_VERSION=v1.37.2
OPENTOFU_VERSION=v1.12.6
TESTPROVIDER_VERSION=0.1.0
CONTAINERD_VERSION=v2.4.2
CNI_PLUGINS_VERSION=v1.10.0
COREDNS_VERSION=v1.15.0
PAUSE_VERSION=1   # hack/tools/pause is ours: bump when it changes
SOURCE_CONTROLLER_VERSION=v1.9.6
GITSERVER_VERSION=1   # hack/tools/gitserver is ours: bump when it changes
# v1.27.x renamed the module gitea.dev, whose packages (gitea.dev/sdk, ...) the
# module proxy does not serve: v1.26.0 is the newest code.gitea.io/gitea that builds.
GITEA_VERSION=v1.26.0

k8s_minor=${KUBERNETES_VERSION#v1.}; k8s_minor=${k8s_minor%%.*}
k8s_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  k8s_ldflags+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor"
  k8s_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

log() { printf '[tools %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# build NAME VERSION MODULE_DIR PACKAGE [LDFLAGS] — go build into the cache unless present.
# BUILD_TAGS and BUILD_DEST (a path other than <cache>/<name>-<version>/<name>) apply when set.
build() {
  local name=$1 version=$2 moddir=$3 pkg=$4 ldflags=${5:--s -w}
  local dest=${BUILD_DEST:-"$cache/$name-$version/$name"}
  if [ -x "$dest" ]; then
    log "$name $version: cached at $dest"
    return
  fi
  log "$name $version: building (this can take many minutes on a cold cache)"
  local start=$SECONDS
  mkdir -p "$(dirname "$dest")"
  # GOOS/GOARCH from the caller cross-compile; BUILD_NICE lowers its priority.
  (cd "$here/$moddir" && CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false" \
    ${BUILD_NICE:+nice -n "$BUILD_NICE"} go build -trimpath ${BUILD_TAGS:+-tags "$BUILD_TAGS"} -ldflags "$ldflags" -o "$dest.tmp" "$pkg")
  mv "$dest.tmp" "$dest"
  log "$name $version: built in $((SECONDS - start))s"
}

assets="$cache/kubebuilder-assets-$KUBERNETES_VERSION"   # the directory envtest wants
tofu_path="$cache/tofu-$OPENTOFU_VERSION/tofu"
provider_mirror="$cache/provider-mirror-$TESTPROVIDER_VERSION"
node_bin="$cache/node-bin"            # symlinks to the node's binaries, for `terrace dev`
cni_bin="$cache/cni-plugins-$CNI_PLUGINS_VERSION"
flux_bin="$cache/flux-bin"            # source-controller, its CRDs (crds/) and the git server, for test/e2e
gitea_bin="$cache/gitea-bin"          # gitea and its templates/, options/, public/, for test/e2e

if [ -n "${KUBEBUILDER_ASSETS:-}" ] && [ -x "$KUBEBUILDER_ASSETS/kube-apiserver" ] && [ -x "$KUBEBUILDER_ASSETS/etcd" ]; then
  assets=$KUBEBUILDER_ASSETS
  user_assets=1
fi
if [ -z "${TERRACE_TOFU:-}" ] && command -v tofu >/dev/null 2>&1; then
  TERRACE_TOFU=$(command -v tofu)
fi
[ -n "${TERRACE_TOFU:-}" ] && tofu_path=$TERRACE_TOFU

# --tofu-for linux/ARCH builds tofu for that platform (the image's arm64 layer
# is cross-compiled; ~12 min of CPU, run under nice) into
# <cache>/tofu-<version>-linux-<arch>/tofu, prints its path, and builds nothing else.
# The host's own platform reuses the ordinary tofu build. --tofu-path-for only prints.
if [ "${1:-}" = "--tofu-for" ] || [ "${1:-}" = "--tofu-path-for" ]; then
  platform=${2:?usage: build.sh --tofu-for linux/ARCH}
  goos=${platform%%/*}; goarch=${platform#*/}
  version=$OPENTOFU_VERSION
  if [ "$goos/$goarch" != "$(go env GOOS)/$(go env GOARCH)" ]; then
    version=$OPENTOFU_VERSION-$goos-$goarch
  fi
  if [ "$1" = "--tofu-for" ]; then
    GOOS=$goos GOARCH=$goarch BUILD_NICE=19 build tofu "$version" opentofu github.com/opentofu/opentofu/cmd/tofu
  fi
  echo "$cache/tofu-$version/tofu"
  exit 0
fi

# --env prints where the tools are (or will be) without building anything.
if [ "${1:-}" = "--env" ]; then
  echo "KUBEBUILDER_ASSETS=$assets"
  echo "TERRACE_TOFU=$tofu_path"
  echo "TERRACE_PROVIDER_MIRROR=$provider_mirror"
  echo "TERRACE_NODE_BIN=$node_bin"
  echo "TERRACE_CNI_BIN=$cni_bin"
  echo "TERRACE_FLUX_BIN=$flux_bin"
  echo "TERRACE_GITEA_BIN=$gitea_bin"
  exit 0
fi

# The groups below share no packages, so they build side by side: the
# Kubernetes commands one after another (they share most of their packages,
# and kube-apiserver's link peaks at ~2.5 GB), Flux's source-controller
# (its own Kubernetes libraries), Gitea (its own too) and everything else
# beside them.
kubernetes_group() {
  if [ -z "${user_assets:-}" ]; then
    build kube-apiserver "$KUBERNETES_VERSION" kubernetes k8s.io/kubernetes/cmd/kube-apiserver "$k8s_ldflags"
    build kube-controller-manager "$KUBERNETES_VERSION" kubernetes k8s.io/kubernetes/cmd/kube-controller-manager "$k8s_ldflags"
    build kubectl "$KUBERNETES_VERSION" kubernetes k8s.io/kubernetes/cmd/kubectl "$k8s_ldflags"
  fi
  # The node: built from the same module, seconds each once the packages above are cached.
  build kubelet "$KUBERNETES_VERSION" kubernetes k8s.io/kubernetes/cmd/kubelet "$k8s_ldflags"
  build kube-scheduler "$KUBERNETES_VERSION" kubernetes k8s.io/kubernetes/cmd/kube-scheduler "$k8s_ldflags"
  build kube-proxy "$KUBERNETES_VERSION" kubernetes k8s.io/kubernetes/cmd/kube-proxy "$k8s_ldflags"
}

other_group() {
  if [ -z "${user_assets:-}" ]; then build etcd "$ETCD_VERSION" etcd .; fi
  local cver="-X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION -s -w"
  BUILD_TAGS="no_btrfs no_devmapper no_zfs no_aufs" build containerd "$CONTAINERD_VERSION" containerd github.com/containerd/containerd/v2/cmd/containerd "$cver"
  BUILD_TAGS="no_btrfs no_devmapper no_zfs no_aufs" build containerd-shim-runc-v2 "$CONTAINERD_VERSION" containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 "$cver"
  local plugin
  for plugin in main/bridge ipam/host-local main/loopback meta/portmap; do
    BUILD_DEST="$cni_bin/${plugin#*/}" build "cni-${plugin#*/}" "$CNI_PLUGINS_VERSION" cni "github.com/containernetworking/plugins/plugins/$plugin"
  done
  build coredns "$COREDNS_VERSION-dev" coredns .
  build pause "$PAUSE_VERSION" pause .
  if [ -z "${TERRACE_TOFU:-}" ]; then
    build tofu "$OPENTOFU_VERSION" opentofu github.com/opentofu/opentofu/cmd/tofu
  else
    log "using tofu from $TERRACE_TOFU"
  fi
}

# source-controller and the git server its end-to-end test fetches from; the
# CRDs come from the same module (config/crd/bases), as Flux's install has them.
flux_group() {
  local dir="$cache/source-controller-$SOURCE_CONTROLLER_VERSION"
  build source-controller "$SOURCE_CONTROLLER_VERSION" source-controller github.com/fluxcd/source-controller
  if [ ! -d "$dir/crds" ]; then
    local moddir
    moddir=$(cd "$here/source-controller" && GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' github.com/fluxcd/source-controller)
    rm -rf "$dir/crds.tmp" && cp -r "$moddir/config/crd/bases" "$dir/crds.tmp" && chmod -R u+w "$dir/crds.tmp"
    mv "$dir/crds.tmp" "$dir/crds"
  fi
  build gitserver "$GITSERVER_VERSION" gitserver .
}

# Gitea, CGO off and without the bindata tag (its assets would need an npm
# build): the binary reads templates/, options/ and public/ from its
# STATIC_ROOT_PATH, copied here from the module. The web UI has no compiled
# JS/CSS; the API and git over HTTP, which the tests use, need none. No sqlite
# tag (it needs CGO): the tests give it PostgreSQL.
gitea_group() {
  local dir="$cache/gitea-$GITEA_VERSION"
  build gitea "$GITEA_VERSION" gitea code.gitea.io/gitea \
    "-s -w -X main.Version=${GITEA_VERSION#v} -X main.Tags="
  if [ ! -d "$dir/static" ]; then
    local moddir d
    moddir=$(cd "$here/gitea" && GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' code.gitea.io/gitea)
    rm -rf "$dir/static.tmp" && mkdir -p "$dir/static.tmp"
    for d in templates options public; do cp -r "$moddir/$d" "$dir/static.tmp/$d"; done
    chmod -R u+w "$dir/static.tmp"
    mv "$dir/static.tmp" "$dir/static"
  fi
}

if [ ! -x "$cache/kubelet-$KUBERNETES_VERSION/kubelet" ] || [ ! -x "$tofu_path" ]; then
  log "cold build ahead, ~30 minutes on two cores: kube-apiserver ~18 min, the other Kubernetes"
  log "commands ~1-3 min each, beside them etcd ~2 min, containerd ~2 min, CoreDNS ~3 min, tofu ~12 min,"
  log "and Flux's source-controller ~4 min, Gitea ~5 min;"
  log "later runs take seconds"
fi
kubernetes_group & k8s_pid=$!
other_group & other_pid=$!
flux_group & flux_pid=$!
gitea_group & gitea_pid=$!
failed=""
wait "$k8s_pid" || failed+=" kubernetes"
wait "$other_pid" || failed+=" etcd/containerd/cni/coredns/pause/tofu"
wait "$flux_pid" || failed+=" source-controller/gitserver"
wait "$gitea_pid" || failed+=" gitea"
if [ -n "$failed" ]; then
  log "failed to build:$failed (see the go build output above)"
  exit 1
fi
if [ -z "${user_assets:-}" ]; then
  mkdir -p "$assets"
  ln -sfn "$cache/etcd-$ETCD_VERSION/etcd" "$assets/etcd"
  for t in kube-apiserver kube-controller-manager kubectl; do
    ln -sfn "$cache/$t-$KUBERNETES_VERSION/$t" "$assets/$t"
  done
fi
mkdir -p "$node_bin"
for t in kubelet kube-scheduler kube-proxy; do
  ln -sfn "$cache/$t-$KUBERNETES_VERSION/$t" "$node_bin/$t"
done
for t in containerd containerd-shim-runc-v2; do
  ln -sfn "$cache/$t-$CONTAINERD_VERSION/$t" "$node_bin/$t"
done
ln -sfn "$cache/coredns-$COREDNS_VERSION-dev/coredns" "$node_bin/coredns"
ln -sfn "$cache/pause-$PAUSE_VERSION/pause" "$node_bin/pause"
mkdir -p "$flux_bin"
ln -sfn "$cache/source-controller-$SOURCE_CONTROLLER_VERSION/source-controller" "$flux_bin/source-controller"
ln -sfn "$cache/source-controller-$SOURCE_CONTROLLER_VERSION/crds" "$flux_bin/crds"
ln -sfn "$cache/gitserver-$GITSERVER_VERSION/gitserver" "$flux_bin/gitserver"
mkdir -p "$gitea_bin"
ln -sfn "$cache/gitea-$GITEA_VERSION/gitea" "$gitea_bin/gitea"
ln -sfn "$cache/gitea-$GITEA_VERSION/static" "$gitea_bin/static"

if [ -d "$here/testprovider" ]; then
  # The drift tests' provider, laid out as a CLI-config filesystem_mirror (unpacked layout).
  target="$provider_mirror/registry.opentofu.org/terrace-dev/testfile/$TESTPROVIDER_VERSION/linux_amd64/terraform-provider-testfile_v$TESTPROVIDER_VERSION"
  if [ -x "$target" ]; then
    log "test provider $TESTPROVIDER_VERSION: cached"
  else
    log "test provider $TESTPROVIDER_VERSION: building"
    mkdir -p "$(dirname "$target")"
    (cd "$here/testprovider" && CGO_ENABLED=0 go build -trimpath -o "$target.tmp" .)
    mv "$target.tmp" "$target"
  fi
fi

echo "KUBEBUILDER_ASSETS=$assets"
echo "TERRACE_TOFU=$tofu_path"
echo "TERRACE_PROVIDER_MIRROR=$provider_mirror"
echo "TERRACE_NODE_BIN=$node_bin"
echo "TERRACE_CNI_BIN=$cni_bin"
echo "TERRACE_FLUX_BIN=$flux_bin"
echo "TERRACE_GITEA_BIN=$gitea_bin"
