//go:build tools

// Package tools pins the tofu command so that go mod tidy keeps its
// dependencies in go.sum.
package tools

import _ "github.com/opentofu/opentofu/cmd/tofu"
