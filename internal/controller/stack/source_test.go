package stack

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/artifact"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/runner"
)

// runnerError is an error as the runner client returns it: a gRPC status
// with the runner's ErrorInfo reason.
func runnerError(t *testing.T, code codes.Code, reason, msg string) error {
	t.Helper()
	st, err := status.New(code, msg).WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: runner.ErrorDomain})
	if err != nil {
		t.Fatal(err)
	}
	return st.Err()
}

func TestClassifySourceErrorGivesEachFailureItsReason(t *testing.T) {
	s := &scope{stack: &terracev1.Stack{}, source: &source{description: "URL http://10.0.0.1/m.tar.gz"}}
	cases := []struct {
		name     string
		err      error
		reason   string
		terminal bool
	}{
		{"digest mismatch", runnerError(t, codes.InvalidArgument, runner.ReasonDigestMismatch, "artifact digest mismatch: expected sha256:00, the content does not match"), SourceDigestMismatchReason, true},
		{"unsafe archive", runnerError(t, codes.InvalidArgument, runner.ReasonUnsafeArchive, `unsafe archive entry "../x"`), SourceUnsafeReason, true},
		{"too large for the runner", runnerError(t, codes.InvalidArgument, runner.ReasonTooLarge, "archive limit exceeded"), SourceTooLargeReason, true},
		{"refused request", runnerError(t, codes.InvalidArgument, runner.ReasonInvalidArgument, "fetch needs an http or https URL with a host"), SourceInvalidReason, true},
		{"404 at the runner", runnerError(t, codes.NotFound, runner.ReasonFetchFailed, "HTTP 404 from 10.0.0.1"), SourceUnavailableReason, false},
		{"unreachable from the runner", runnerError(t, codes.Unavailable, runner.ReasonFetchFailed, "connection refused"), SourceUnavailableReason, false},
		{"404 at the controller", &artifact.FetchStatusError{Host: "source-controller", StatusCode: 404}, SourceUnavailableReason, false},
		{"unreachable from the controller", fmt.Errorf("%w: dial tcp: refused", artifact.ErrUnreachable), SourceUnavailableReason, false},
		{"too large at the controller", fmt.Errorf("failed to read: %w: artifact is larger than 10 bytes", artifact.ErrLimitExceeded), SourceTooLargeReason, true},
		{"redirect off the allowlist", fmt.Errorf("failed to fetch: %w", &artifact.HostNotAllowedError{Host: "169.254.169.254"}), SourceHostNotAllowedReason, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := classifySourceError(s, tc.err)
			var terminal *outcome.TerminalError
			var waiting *outcome.WaitingError
			switch {
			case errors.As(err, &terminal):
				if !tc.terminal || terminal.Reason != tc.reason {
					t.Fatalf("terminal %s, want reason %s (terminal %v): %v", terminal.Reason, tc.reason, tc.terminal, err)
				}
			case errors.As(err, &waiting):
				if tc.terminal || waiting.Reason != tc.reason {
					t.Fatalf("waiting %s, want reason %s (terminal %v): %v", waiting.Reason, tc.reason, tc.terminal, err)
				}
			default:
				t.Fatalf("transient %v, want reason %s", err, tc.reason)
			}
			if !strings.Contains(err.Error(), s.source.description) {
				t.Errorf("message %q does not name the source", err)
			}
		})
	}
	// A runner that died, or a call cut off, is transient: the run is retried.
	if err := classifySourceError(s, status.Error(codes.Unavailable, "connection reset")); errors.As(err, new(*outcome.TerminalError)) || errors.As(err, new(*outcome.WaitingError)) {
		t.Errorf("a broken connection to the runner is not transient: %v", err)
	}
}

func TestFluxArtifactHostIsCheckedBeforeAnyRun(t *testing.T) {
	allowed, err := artifact.ParseHostAllowlist([]string{"source-controller.flux-system.svc.cluster.local"})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		url    string
		refuse bool
	}{
		{"http://source-controller.flux-system.svc.cluster.local./gitrepository/team-a/infra/abc.tar.gz", false},
		{"http://127.0.0.1:18999/creds", true},
		{"http://169.254.169.254/latest/meta-data/iam/", true},
		{"file:///var/run/secrets/kubernetes.io/serviceaccount/token", true},
	}
	for _, tc := range cases {
		t.Run(tc.url, func(t *testing.T) {
			repo := &unstructured.Unstructured{}
			repo.SetAPIVersion("source.toolkit.fluxcd.io/v1")
			repo.SetKind("GitRepository")
			repo.SetNamespace("team-a")
			repo.SetName("infra")
			repo.Object["status"] = map[string]any{"artifact": map[string]any{
				"url": tc.url, "digest": "sha256:" + strings.Repeat("ab", 32), "revision": "main@sha1:1234",
			}}
			r := &Reconciler{
				APIReader: fake.NewClientBuilder().WithObjects(repo).Build(),
				Options:   Options{SourceArtifactHosts: allowed},
			}
			s := &scope{stack: &terracev1.Stack{
				ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "web"},
				Spec:       terracev1.StackSpec{Source: terracev1.StackSource{SourceRef: &terracev1.SourceReference{Kind: "GitRepository", Name: "infra"}}},
			}}
			err := r.resolveSource(context.Background(), s)
			var terminal *outcome.TerminalError
			if !tc.refuse {
				if err != nil || s.source.origin != fromFluxArtifact {
					t.Fatalf("allowed host refused: %v", err)
				}
				return
			}
			if !errors.As(err, &terminal) || terminal.Reason != SourceHostNotAllowedReason {
				t.Fatalf("want %s, got %v", SourceHostNotAllowedReason, err)
			}
			if !strings.Contains(err.Error(), "--source-artifact-hosts") {
				t.Errorf("message %q does not name the flag", err)
			}
		})
	}
}
