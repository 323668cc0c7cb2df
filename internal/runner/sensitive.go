package runner

import (
	"context"

	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// SetSensitiveVariables tells a runner which variables came from Secrets,
// before it applies a plan another runner made (Plan carries the names
// itself), so the apply's output (`Outputs: pin = 7`) is masked too.
func (c *Client) SetSensitiveVariables(ctx context.Context, names []string) error {
	_, err := c.rpc.SetSensitiveVariables(ctx, &runnerv1.SetSensitiveVariablesRequest{Names: names})
	return err
}
