package server

import (
	"context"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// Usage implements runnerv1.RunnerServiceServer. It takes no operation
// slot: it reads the kernel's counters and may come while a command runs.
// Every process the runner starts is tofu or one of tofu's (its providers,
// reaped by tofu and counted in tofu's children), so the children's time
// is tofu's.
func (s *Server) Usage(context.Context, *runnerv1.UsageRequest) (*runnerv1.UsageResponse, error) {
	var self, children syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &self); err != nil {
		return nil, status.Errorf(codes.Internal, "failed to read the runner's CPU time: %v", err)
	}
	if err := syscall.Getrusage(syscall.RUSAGE_CHILDREN, &children); err != nil {
		return nil, status.Errorf(codes.Internal, "failed to read tofu's CPU time: %v", err)
	}
	return &runnerv1.UsageResponse{
		RunnerCpuSeconds: cpuSeconds(&self),
		TofuCpuSeconds:   cpuSeconds(&children),
		TofuProcesses:    int32(s.exec.Processes()),
	}, nil
}

func cpuSeconds(u *syscall.Rusage) float64 {
	return (time.Duration(u.Utime.Nano()) + time.Duration(u.Stime.Nano())).Seconds()
}
