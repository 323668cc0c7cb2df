//go:build tools

// Package tools pins CoreDNS, the dev cluster's DNS server, so that go mod
// tidy keeps its dependencies in go.sum.
package tools

import _ "github.com/coredns/coredns"
