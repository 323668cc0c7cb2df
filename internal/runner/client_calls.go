package runner

import (
	"context"
	"fmt"

	"github.com/terrace-dev/terrace/internal/pki"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// Claim hands a warm runner the credentials of the run that claims it and
// returns the run identity the runner now presents.
func (c *Client) Claim(ctx context.Context, leaf *pki.Leaf) (pki.Identity, error) {
	resp, err := c.rpc.Claim(ctx, &runnerv1.ClaimRequest{CertificatePem: leaf.CertPEM, KeyPem: leaf.KeyPEM, CaBundlePem: leaf.CABundlePEM})
	if err != nil {
		return "", fmt.Errorf("failed to claim the warm runner: %w", err)
	}
	return pki.Identity(resp.GetIdentity()), nil
}

// CheckHealth asks the runner to run health checks.
func (c *Client) CheckHealth(ctx context.Context, checks []*runnerv1.HealthCheck) ([]*runnerv1.HealthCheckResult, error) {
	resp, err := c.rpc.CheckHealth(ctx, &runnerv1.CheckHealthRequest{Checks: checks})
	if err != nil {
		return nil, err
	}
	return resp.GetResults(), nil
}

// ListPullRequests asks the runner to list a forge's open pull requests
// into a branch, from the pod's network position, with the credentials
// mounted in the pod.
func (c *Client) ListPullRequests(ctx context.Context, req *runnerv1.ListPullRequestsRequest) (*runnerv1.ListPullRequestsResponse, error) {
	return c.rpc.ListPullRequests(ctx, req)
}

// PublishPullRequestPlan asks the runner to post a plan to its pull
// request (the Stack's comment and the head commit's status).
func (c *Client) PublishPullRequestPlan(ctx context.Context, req *runnerv1.PublishPullRequestPlanRequest) error {
	_, err := c.rpc.PublishPullRequestPlan(ctx, req)
	return err
}

// Usage asks the runner what it has cost so far (runnerv1.UsageResponse).
func (c *Client) Usage(ctx context.Context) (*runnerv1.UsageResponse, error) {
	return c.rpc.Usage(ctx, &runnerv1.UsageRequest{})
}
