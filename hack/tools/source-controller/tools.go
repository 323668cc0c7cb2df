//go:build tools

// Package tools pins the source-controller command so that go mod tidy
// keeps its dependencies in go.sum.
package tools

import _ "github.com/fluxcd/source-controller"
