//go:build tools

// Package tools pins containerd and its runc shim so that go mod tidy keeps
// their dependencies in go.sum. They are built with CGO off and the tags
// no_btrfs no_devmapper no_zfs no_aufs (hack/tools/build.sh).
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
)
