// Package release keeps the history of a Stack's applies, like Helm's release
// storage: one record per applied revision with its source revision, plan
// summary, outputs (sensitive values redacted), times, tool version and a
// status of deployed, superseded or failed.
//
// It holds the plain record types, their encoding and the [Store] interface;
// the state backends implement Store next to their state and plan stores
// (internal/state/secrets, internal/state/postgres). [History] is what a
// controller uses:
//
//	h := release.History{Store: secrets.New(c, secrets.Options{}), Limit: 10}
//	rel, err := h.Record(ctx, release.Release{Namespace: ns, Stack: name,
//	    Status: release.StatusDeployed, SourceRevision: rev, Plan: summary,
//	    Outputs: outs, StartedAt: t0, FinishedAt: t1, ToolVersion: v})
//	// rel.Revision is the new revision; the previous deployed one is now superseded
//	latest, err := h.Latest(ctx, ns, name) // for status.release
package release

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/terrace-dev/terrace/internal/state"
)

// Status of a release, as in Helm.
type Status string

const (
	// StatusDeployed is the revision whose apply succeeded last.
	StatusDeployed Status = "deployed"
	// StatusSuperseded is an earlier deployed revision.
	StatusSuperseded Status = "superseded"
	// StatusFailed is a revision whose apply failed.
	StatusFailed Status = "failed"
)

// PlanSummary counts the resource changes of the applied plan.
type PlanSummary struct {
	Add     int `json:"add"`
	Change  int `json:"change"`
	Destroy int `json:"destroy"`
}

// Output is one root module output. Value is nil for a sensitive output:
// records never hold sensitive values.
type Output struct {
	Name      string          `json:"name"`
	Sensitive bool            `json:"sensitive,omitempty"`
	Value     json.RawMessage `json:"value,omitempty"`
	// FromSecret says the output was held back because its value contained
	// a value from a Secret; Sensitive is set too, so every reader masks it.
	FromSecret bool `json:"fromSecret,omitempty"`
}

// PolicyDecision is what the plan policies said about the applied plan.
type PolicyDecision struct {
	Decision       string   `json:"decision"`
	Warnings       []string `json:"warnings,omitempty"`
	PoliciesDigest string   `json:"policiesDigest,omitempty"`
}

// HealthCheckResult is one health check after an apply.
type HealthCheckResult struct {
	Name    string `json:"name"`
	Passed  bool   `json:"passed"`
	Message string `json:"message,omitempty"`
}

// SecretValues recognises values that came from Secrets (*tf.Redactor is one).
type SecretValues interface {
	ContainsSecret(value json.RawMessage) bool
}

// Release is one applied revision of a Stack.
type Release struct {
	Namespace string `json:"namespace"`
	Stack     string `json:"stack"`
	// Revision counts the Stack's releases from 1.
	Revision       int         `json:"revision"`
	Status         Status      `json:"status"`
	SourceRevision string      `json:"sourceRevision,omitempty"`
	PlanID         string      `json:"planId,omitempty"`
	Plan           PlanSummary `json:"plan"`
	Outputs        []Output    `json:"outputs,omitempty"`
	StartedAt      time.Time   `json:"startedAt"`
	FinishedAt     time.Time   `json:"finishedAt"`
	ToolVersion    string      `json:"toolVersion,omitempty"`
	// RunnerImage is the runner image that applied it, by digest
	// (repository@sha256:...) when the node reported one.
	RunnerImage string `json:"runnerImage,omitempty"`
	// Message says why a failed release failed (no secrets), or how a
	// release was recorded when no run of this controller applied it.
	Message string `json:"message,omitempty"`
	// Policy is the plan policies' decision on the applied plan, when any apply.
	Policy *PolicyDecision `json:"policy,omitempty"`
	// HealthChecks are the results of spec.healthChecks after the apply.
	HealthChecks []HealthCheckResult `json:"healthChecks,omitempty"`
	// StateSerial is the serial of the state the apply left (0: not known,
	// records from before it was kept). An apply that only puts back what
	// the state records (a drift repaired) leaves the serial as it was.
	StateSerial int64 `json:"stateSerial,omitempty"`

	// SecretInputs recognises the Stack's inputs from Secrets. tofu marks
	// an output sensitive only when the module declares it so, so an
	// output that merely passes a Secret's value on (`value = var.pin`)
	// is not; the rule here is that an output whose value contains any
	// value from a Secret (whole, or as text inside a string) is recorded
	// like a sensitive one, without its value. It is not stored.
	SecretInputs SecretValues `json:"-"`

	// Migrated is set when the record was copied to another backend; it is
	// kept by the store, outside the body.
	Migrated *state.MigrationMark `json:"-"`
}

// Redacted returns the outputs with every sensitive value removed.
func Redacted(outputs []Output) []Output {
	return HoldBack(outputs, nil)
}

// HoldBack returns the outputs with every sensitive value removed, and
// every value that contains a value from a Secret (secrets may be nil)
// removed and its output marked sensitive and FromSecret.
func HoldBack(outputs []Output, secrets SecretValues) []Output {
	out := make([]Output, len(outputs))
	for i, o := range outputs {
		out[i] = o
		if !o.Sensitive && o.Value != nil && secrets != nil && secrets.ContainsSecret(o.Value) {
			out[i].Sensitive, out[i].FromSecret = true, true
		}
		if out[i].Sensitive {
			out[i].Value = nil
		}
	}
	return out
}

// Validate checks what every store relies on.
func (r *Release) Validate() error {
	if r.Namespace == "" || r.Stack == "" {
		return fmt.Errorf("release needs a namespace and a stack")
	}
	if r.Revision < 1 {
		return fmt.Errorf("release %s/%s has revision %d, revisions start at 1", r.Namespace, r.Stack, r.Revision)
	}
	switch r.Status {
	case StatusDeployed, StatusSuperseded, StatusFailed:
	default:
		return fmt.Errorf("release %s/%s revision %d has unknown status %q", r.Namespace, r.Stack, r.Revision, r.Status)
	}
	return nil
}

// Encode returns the gzip JSON body of r, with sensitive output values and
// those built from Secret values removed.
func Encode(r *Release) ([]byte, error) {
	c := *r
	c.Outputs = HoldBack(r.Outputs, r.SecretInputs)
	raw, err := json.Marshal(&c)
	if err != nil {
		return nil, fmt.Errorf("failed to encode release: %w", err)
	}
	body, err := state.Gzip(raw, gzip.DefaultCompression)
	if err != nil {
		return nil, fmt.Errorf("failed to compress release: %w", err)
	}
	return body, nil
}

// Decode reads a body written by Encode. what names the record in errors.
func Decode(body []byte, what string) (*Release, error) {
	zr, err := gzip.NewReader(bytes.NewReader(body))
	if err != nil {
		return nil, &state.CorruptError{What: what, Reason: "release body is not gzip data"}
	}
	raw, err := io.ReadAll(io.LimitReader(zr, 64<<20))
	if err != nil {
		return nil, &state.CorruptError{What: what, Reason: "release body is damaged"}
	}
	r := &Release{}
	if err := json.Unmarshal(raw, r); err != nil {
		return nil, &state.CorruptError{What: what, Reason: "release body is not valid JSON"}
	}
	return r, nil
}

// Digest identifies the contents of a release (not its migration mark), for
// verifying a copy.
func Digest(r *Release) string {
	c := *r
	c.Outputs = HoldBack(r.Outputs, r.SecretInputs)
	c.StartedAt, c.FinishedAt = c.StartedAt.UTC(), c.FinishedAt.UTC()
	raw, _ := json.Marshal(&c)
	return state.Digest(raw)
}

// Store keeps release records. Implementations: internal/state/secrets
// (one Secret per record) and internal/state/postgres.
type Store interface {
	// CreateRelease stores a new record; an existing revision is a
	// *state.ConflictError.
	CreateRelease(ctx context.Context, r *Release) error
	// UpdateRelease replaces an existing record (its status, times, message).
	UpdateRelease(ctx context.Context, r *Release) error
	// GetRelease returns one record or an error matching state.ErrNotFound.
	GetRelease(ctx context.Context, namespace, stack string, revision int) (*Release, error)
	// ListReleases returns the records of a Stack, a namespace (stack "") or
	// every namespace (both ""), by namespace, stack and revision.
	ListReleases(ctx context.Context, namespace, stack string) ([]Release, error)
	// DeleteRelease removes a record; a missing one is not an error.
	DeleteRelease(ctx context.Context, namespace, stack string, revision int) error
	// MarkReleaseMigrated sets (or with nil clears) a record's migration mark.
	MarkReleaseMigrated(ctx context.Context, namespace, stack string, revision int, mark *state.MigrationMark) error
}

// Sort orders releases by namespace, stack and revision.
func Sort(rs []Release) {
	sort.Slice(rs, func(i, j int) bool {
		a, b := rs[i], rs[j]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		if a.Stack != b.Stack {
			return a.Stack < b.Stack
		}
		return a.Revision < b.Revision
	})
}
