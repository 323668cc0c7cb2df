package runner

import (
	"context"
	"fmt"
	"sort"

	"google.golang.org/grpc/codes"

	"github.com/terrace-dev/terrace/internal/tf"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// Init initialises the module, optionally against the controller's state server.
func (s *Server) Init(req *runnerv1.InitRequest, stream runnerv1.RunnerService_InitServer) error {
	release, err := s.acquire("init")
	if err != nil {
		return err
	}
	defer release()
	opts := tf.InitOptions{Path: req.GetPath(), Workspace: req.GetWorkspace(), Upgrade: req.GetUpgrade()}
	if b := req.GetHttpBackend(); b != nil {
		if s.cfg.BackendLeaf == nil {
			return statusError(codes.FailedPrecondition, ReasonNotReady, "this runner has no certificate files for the http backend")
		}
		leaf, err := s.cfg.BackendLeaf()
		if err != nil {
			return s.toStatus(fmt.Errorf("failed to load the runner certificate for the http backend: %w", err))
		}
		opts.HTTPBackend = &tf.HTTPBackend{
			Address: b.GetAddress(), LockAddress: b.GetLockAddress(), UnlockAddress: b.GetUnlockAddress(),
			LockMethod: b.GetLockMethod(), UnlockMethod: b.GetUnlockMethod(), UpdateMethod: b.GetUpdateMethod(),
			ClientCertificatePEM: leaf.CertPEM, ClientKeyPEM: leaf.KeyPEM, CACertificatePEM: leaf.CABundlePEM,
		}
	}
	logf, mu := s.logSender(func(l *runnerv1.LogLine) error {
		return stream.Send(&runnerv1.InitResponse{Event: &runnerv1.InitResponse_Log{Log: l}})
	})
	res, err := s.exec.Init(stream.Context(), opts, logf)
	if err != nil {
		return s.toStatus(err)
	}
	release()
	mu.Lock()
	defer mu.Unlock()
	return stream.Send(&runnerv1.InitResponse{Event: &runnerv1.InitResponse_Result{Result: &runnerv1.InitResult{
		Version: res.Version, ProviderVersions: res.ProviderVersions,
	}}})
}

func variables(v *runnerv1.Variables) tf.Variables {
	return tf.Variables{JSON: v.GetJson(), Sensitive: v.GetSensitive(), Files: v.GetFiles()}
}

// Plan saves a plan and streams its logs, redacted JSON and summary.
func (s *Server) Plan(req *runnerv1.PlanRequest, stream runnerv1.RunnerService_PlanServer) error {
	release, err := s.acquire("plan")
	if err != nil {
		return err
	}
	defer release()
	logf, mu := s.logSender(func(l *runnerv1.LogLine) error {
		return stream.Send(&runnerv1.PlanResponse{Event: &runnerv1.PlanResponse_Log{Log: l}})
	})
	res, err := s.exec.Plan(stream.Context(), tf.PlanOptions{
		Variables: variables(req.GetVariables()), Destroy: req.GetDestroy(), RefreshOnly: req.GetRefreshOnly(),
		Targets: req.GetTargets(), PlanID: req.GetPlanId(),
	}, logf)
	if err != nil {
		return s.toStatus(err)
	}
	release()
	mu.Lock()
	defer mu.Unlock()
	if err := sendChunks(res.JSON, func(c []byte) error {
		return stream.Send(&runnerv1.PlanResponse{Event: &runnerv1.PlanResponse_JsonChunk{JsonChunk: c}})
	}); err != nil {
		return err
	}
	return stream.Send(&runnerv1.PlanResponse{Event: &runnerv1.PlanResponse_Result{Result: &runnerv1.PlanResult{
		PlanId:     res.PlanID,
		HasChanges: res.HasChanges,
		Summary: &runnerv1.PlanSummary{
			Add: int32(res.Summary.Add), Change: int32(res.Summary.Change), Destroy: int32(res.Summary.Destroy),
			Import: int32(res.Summary.Import), Forget: int32(res.Summary.Forget), Drift: int32(res.Summary.Drift),
			OutputChanges: int32(res.Summary.OutputChanges),
		},
		JsonSize:     int64(len(res.JSON)),
		PlanFileSize: res.PlanFileSize,
	}}})
}

// ShowPlan streams a saved plan, redacted, as JSON or human text.
func (s *Server) ShowPlan(req *runnerv1.ShowPlanRequest, stream runnerv1.RunnerService_ShowPlanServer) error {
	release, err := s.acquire("show-plan")
	if err != nil {
		return err
	}
	defer release()
	var data []byte
	switch req.GetFormat() {
	case runnerv1.PlanFormat_PLAN_FORMAT_JSON, runnerv1.PlanFormat_PLAN_FORMAT_UNSPECIFIED:
		data, err = s.exec.ShowPlanJSON(stream.Context(), req.GetPlanId())
	case runnerv1.PlanFormat_PLAN_FORMAT_HUMAN:
		data, err = s.exec.ShowPlanHuman(stream.Context(), req.GetPlanId())
	default:
		return statusError(codes.InvalidArgument, ReasonInvalidArgument, fmt.Sprintf("unknown plan format %v", req.GetFormat()))
	}
	if err != nil {
		return s.toStatus(err)
	}
	return sendChunks(data, func(c []byte) error { return stream.Send(&runnerv1.ShowPlanResponse{Chunk: c}) })
}

// Apply applies exactly one saved plan.
func (s *Server) Apply(req *runnerv1.ApplyRequest, stream runnerv1.RunnerService_ApplyServer) error {
	release, err := s.acquire("apply")
	if err != nil {
		return err
	}
	defer release()
	logf, mu := s.logSender(func(l *runnerv1.LogLine) error {
		return stream.Send(&runnerv1.ApplyResponse{Event: &runnerv1.ApplyResponse_Log{Log: l}})
	})
	if err := s.exec.Apply(stream.Context(), req.GetPlanId(), logf); err != nil {
		return s.toStatus(err)
	}
	release()
	mu.Lock()
	defer mu.Unlock()
	return stream.Send(&runnerv1.ApplyResponse{Event: &runnerv1.ApplyResponse_Result{Result: &runnerv1.ApplyResult{PlanId: req.GetPlanId()}}})
}

// Output streams every root output, each value in chunks.
func (s *Server) Output(_ *runnerv1.OutputRequest, stream runnerv1.RunnerService_OutputServer) error {
	release, err := s.acquire("output")
	if err != nil {
		return err
	}
	defer release()
	outs, err := s.exec.Outputs(stream.Context())
	if err != nil {
		return s.toStatus(err)
	}
	names := make([]string, 0, len(outs))
	for n := range outs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		o := outs[name]
		value := []byte(o.Value)
		first := true
		for first || len(value) > 0 {
			n := min(len(value), chunkSize)
			msg := &runnerv1.OutputResponse{Name: name, Sensitive: o.Sensitive, ValueChunk: value[:n], Last: n == len(value)}
			if first {
				msg.TypeJson = o.Type
			}
			if err := stream.Send(msg); err != nil {
				return err
			}
			value = value[n:]
			first = false
		}
	}
	return nil
}

// Destroy destroys everything in the state.
func (s *Server) Destroy(req *runnerv1.DestroyRequest, stream runnerv1.RunnerService_DestroyServer) error {
	release, err := s.acquire("destroy")
	if err != nil {
		return err
	}
	defer release()
	logf, mu := s.logSender(func(l *runnerv1.LogLine) error {
		return stream.Send(&runnerv1.DestroyResponse{Event: &runnerv1.DestroyResponse_Log{Log: l}})
	})
	if err := s.exec.Destroy(stream.Context(), tf.DestroyOptions{Variables: variables(req.GetVariables()), Targets: req.GetTargets()}, logf); err != nil {
		return s.toStatus(err)
	}
	release()
	mu.Lock()
	defer mu.Unlock()
	return stream.Send(&runnerv1.DestroyResponse{Event: &runnerv1.DestroyResponse_Result{Result: &runnerv1.DestroyResult{}}})
}

// ForceUnlock removes a state lock.
func (s *Server) ForceUnlock(ctx context.Context, req *runnerv1.ForceUnlockRequest) (*runnerv1.ForceUnlockResponse, error) {
	release, err := s.acquire("force-unlock")
	if err != nil {
		return nil, err
	}
	defer release()
	if err := s.exec.ForceUnlock(ctx, req.GetLockId()); err != nil {
		return nil, s.toStatus(err)
	}
	return &runnerv1.ForceUnlockResponse{}, nil
}
