package stack

import (
	"encoding/json"
	"testing"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/policy"
)

// The desired-state digest is computed in one place, and for the same
// inputs it is the digest the controller computed before it was (in three
// steps whose order mattered): digests recorded in status stay valid, so
// an upgrade plans nothing anew. The values were computed by that code.
func TestDesiredDigestKeepsRecordedDigests(t *testing.T) {
	stack := &terracev1.Stack{Spec: terracev1.StackSpec{Path: "app", Workspace: "prod"}}
	s := &scope{stack: stack, source: &source{digest: "sha256:src"}, inputs: &inputs{
		vars:           map[string]json.RawMessage{"region": json.RawMessage(`"eu"`), "token": json.RawMessage(`"x"`)},
		secretVersions: map[string]string{"token": "creds@7"},
	}}
	if got, want := desiredDigest(s), "sha256:4991ef564b02271611c0013bf95e6ea28cfbdd947c2aa8621bd1db6105f45b7b"; got != want {
		t.Fatalf("inputs only: %s, want %s", got, want)
	}
	s.options = &runOptions{}
	if got, want := desiredDigest(s), "sha256:4991ef564b02271611c0013bf95e6ea28cfbdd947c2aa8621bd1db6105f45b7b"; got != want {
		t.Fatalf("without run options: %s, want the inputs' %s", got, want)
	}
	stack.Spec.Targets = []string{"a.b"}
	s.options.policies = &planPolicies{set: &policy.Set{Digest: "sha256:pol"}}
	if got, want := desiredDigest(s), "sha256:6ba37c915fd93cf4664a217afd6099cc2697a35032ae0e9218a6998452e91b00"; got != want {
		t.Fatalf("with targets and policies: %s, want %s", got, want)
	}
}
