//go:build tools

// Package tools pins the gitea command so that go mod tidy keeps its
// dependencies in go.sum.
package tools

import _ "code.gitea.io/gitea"
