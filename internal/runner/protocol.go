// Package runner is the controller's side of the runner's gRPC service
// (terrace.runner.v1): the client, and the protocol's constants and error
// reasons. The service itself, which runs in the runner pod, is in
// internal/runner/server.
package runner

// ChunkSize is the largest payload of one streamed message, well under
// gRPC's 4 MiB default.
const ChunkSize = 1 << 20

// Defaults of the size limits.
const (
	DefaultMaxArchiveBytes  = 100 << 20
	DefaultMaxPlanFileBytes = 1 << 30
)

// ServiceName is the name the health service reports for the runner.
const ServiceName = "terrace.runner.v1.RunnerService"

// The status of a pull request's plan in PublishPullRequestPlan: the values
// of status.pullRequests[].status (terracev1.PullRequestPlanPlanned and
// Failed; the runner links no Kubernetes types).
const (
	PullRequestPlanned = "Planned"
	PullRequestFailed  = "Failed"
)
