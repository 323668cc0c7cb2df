//go:build tools

// Package tools pins the commands built from k8s.io/kubernetes (the control
// plane, kubectl, and the dev cluster's node) so that go mod tidy keeps their
// dependencies in go.sum.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
