package server

import (
	"context"

	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// SetSensitiveVariables implements the RPC: the named variables' values are
// masked from then on, read from any plan file this runner applies.
func (s *Server) SetSensitiveVariables(_ context.Context, req *runnerv1.SetSensitiveVariablesRequest) (*runnerv1.SetSensitiveVariablesResponse, error) {
	release, err := s.acquire("set-sensitive-variables")
	if err != nil {
		return nil, err
	}
	defer release()
	s.exec.MarkSensitive(req.GetNames())
	return &runnerv1.SetSensitiveVariablesResponse{}, nil
}
