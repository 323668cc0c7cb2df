package server

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/terrace-dev/terrace/internal/runner"
	"github.com/terrace-dev/terrace/internal/runphase"
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
	opts := tf.InitOptions{Path: req.GetPath(), Workspace: req.GetWorkspace(), Upgrade: req.GetUpgrade(), Files: mappedFiles(req.GetFiles())}
	if b := req.GetHttpBackend(); b != nil {
		leaf, err := s.backendLeaf()
		if err != nil {
			return s.toStatus(fmt.Errorf("failed to load the runner certificate for the http backend: %w", err))
		}
		if leaf == nil {
			return statusError(codes.FailedPrecondition, runner.ReasonNotReady, "this runner has no certificate files for the http backend")
		}
		opts.HTTPBackend = &tf.HTTPBackend{
			Address: b.GetAddress(), LockAddress: b.GetLockAddress(), UnlockAddress: b.GetUnlockAddress(),
			LockMethod: b.GetLockMethod(), UnlockMethod: b.GetUnlockMethod(), UpdateMethod: b.GetUpdateMethod(),
			ClientCertificatePEM: leaf.CertPEM, ClientKeyPEM: leaf.KeyPEM, CACertificatePEM: leaf.CABundlePEM,
		}
	}
	opts.OwnBackend = ownBackend(req.GetOwnBackend())
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

// ownBackend is the Stack's own backend block, nil when the request names none.
func ownBackend(b *runnerv1.OwnBackend) *tf.OwnBackend {
	if b == nil {
		return nil
	}
	out := &tf.OwnBackend{Type: b.GetType(), Config: b.GetConfigJson()}
	for _, c := range b.GetCredentials() {
		out.Credentials = append(out.Credentials, tf.BackendCredential{Env: c.GetEnv(), Value: c.GetValue(), AsFile: c.GetAsFile()})
	}
	return out
}

func variables(v *runnerv1.Variables) tf.Variables {
	return tf.Variables{JSON: v.GetJson(), Sensitive: v.GetSensitive(), Files: v.GetFiles()}
}

func planOptions(req *runnerv1.PlanRequest) tf.PlanOptions {
	return tf.PlanOptions{
		Variables: variables(req.GetVariables()), Destroy: req.GetDestroy(), RefreshOnly: req.GetRefreshOnly(),
		Targets: req.GetTargets(), PlanID: req.GetPlanId(),
		Parallelism: int(req.GetParallelism()), SkipRefresh: req.GetSkipRefresh(), Replace: req.GetReplace(),
		NoLock: req.GetNoLock(),
	}
}

func mappedFiles(files []*runnerv1.MappedFile) []tf.MappedFile {
	out := make([]tf.MappedFile, 0, len(files))
	for _, f := range files {
		var loc tf.FileLocation // unspecified stays 0: refused by tf
		switch f.GetLocation() {
		case runnerv1.FileLocation_FILE_LOCATION_MODULE:
			loc = tf.InModule
		case runnerv1.FileLocation_FILE_LOCATION_HOME:
			loc = tf.InHome
		}
		out = append(out, tf.MappedFile{Location: loc, Path: f.GetPath(), Content: f.GetContent()})
	}
	return out
}

func planResult(res *tf.PlanResult) *runnerv1.PlanResult {
	return &runnerv1.PlanResult{
		PlanId:     res.PlanID,
		HasChanges: res.HasChanges,
		Summary: &runnerv1.PlanSummary{
			Add: int32(res.Summary.Add), Change: int32(res.Summary.Change), Destroy: int32(res.Summary.Destroy),
			Import: int32(res.Summary.Import), Forget: int32(res.Summary.Forget), Drift: int32(res.Summary.Drift),
			OutputChanges: int32(res.Summary.OutputChanges),
		},
		JsonSize:          int64(len(res.JSON)),
		PlanFileSize:      res.PlanFileSize,
		PlannedStateBytes: res.PlannedStateBytes,
	}
}

// stateTooLarge refuses to apply a plan whose state the state server
// would refuse: the apply would change the resources and lose the state
// that records them.
func stateTooLarge(res *tf.PlanResult, limit int64) error {
	if limit <= 0 || res.PlannedStateBytes <= limit {
		return nil
	}
	return statusError(codes.FailedPrecondition, runner.ReasonStateTooLarge, tf.StateTooLargeMessage(res.PlanID, res.PlannedStateBytes, limit))
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
	res, err := s.exec.Plan(stream.Context(), planOptions(req), logf)
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
	return stream.Send(&runnerv1.PlanResponse{Event: &runnerv1.PlanResponse_Result{Result: planResult(res)}})
}

// PlanAndApply plans and, when the plan has changes, applies it in one
// operation: the plan's result first, then the apply's logs and result.
func (s *Server) PlanAndApply(req *runnerv1.PlanRequest, stream runnerv1.RunnerService_PlanAndApplyServer) error {
	release, err := s.acquire("plan-and-apply")
	if err != nil {
		return err
	}
	defer release()
	var sendMu sync.Mutex
	send := func(msg *runnerv1.PlanAndApplyResponse) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return stream.Send(msg)
	}
	logf, _ := s.logSender(func(l *runnerv1.LogLine) error {
		return send(&runnerv1.PlanAndApplyResponse{Event: &runnerv1.PlanAndApplyResponse_Log{Log: l}})
	})
	if req.GetNoLock() {
		// -lock=false is for plans that are never applied.
		return statusError(codes.InvalidArgument, runner.ReasonInvalidArgument, "no_lock is for plans only: an apply always holds the state lock")
	}
	if req.GetOneProcess() {
		return s.applyInOneProcess(stream.Context(), req, logf, send, release)
	}
	res, err := timed(s, runphase.Plan, func() (*tf.PlanResult, error) { return s.exec.Plan(stream.Context(), planOptions(req), logf) })
	if err != nil {
		return s.toStatus(err)
	}
	if err := sendChunks(res.JSON, func(c []byte) error {
		return send(&runnerv1.PlanAndApplyResponse{Event: &runnerv1.PlanAndApplyResponse_JsonChunk{JsonChunk: c}})
	}); err != nil {
		return err
	}
	if !res.HasChanges {
		release()
		return send(&runnerv1.PlanAndApplyResponse{Event: &runnerv1.PlanAndApplyResponse_PlanResult{PlanResult: planResult(res)}})
	}
	if err := send(&runnerv1.PlanAndApplyResponse{Event: &runnerv1.PlanAndApplyResponse_PlanResult{PlanResult: planResult(res)}}); err != nil {
		return err
	}
	if err := stateTooLarge(res, req.GetMaxStateBytes()); err != nil {
		return err
	}
	applyOpts := tf.ApplyOptions{PlanID: res.PlanID, Parallelism: int(req.GetParallelism())}
	if _, err := timed(s, runphase.Apply, func() (struct{}, error) { return struct{}{}, s.exec.ApplyWith(stream.Context(), applyOpts, logf) }); err != nil {
		return s.toStatus(err)
	}
	release()
	return send(&runnerv1.PlanAndApplyResponse{Event: &runnerv1.PlanAndApplyResponse_ApplyResult{ApplyResult: &runnerv1.ApplyResult{PlanId: res.PlanID}}})
}

// applyInOneProcess is PlanAndApply under one_process: the plan's result
// is sent as soon as tofu moves from planning to applying, the apply's
// when it is done.
func (s *Server) applyInOneProcess(ctx context.Context, req *runnerv1.PlanRequest, logf tf.LogFunc, send func(*runnerv1.PlanAndApplyResponse) error, release func()) error {
	start := time.Now()
	var planSent error
	planned := func(res *tf.PlanResult) {
		s.logPhase(runphase.Plan, start, false)
		start = time.Now()
		planSent = send(&runnerv1.PlanAndApplyResponse{Event: &runnerv1.PlanAndApplyResponse_PlanResult{PlanResult: planResult(res)}})
	}
	res, applied, err := s.exec.ApplyInOneProcess(ctx, planOptions(req), logf, planned)
	if res == nil {
		return s.toStatus(err)
	}
	if applied {
		s.logPhase(runphase.Apply, start, err != nil)
	}
	if err != nil {
		return s.toStatus(err)
	}
	release()
	if planSent != nil || !applied {
		return planSent
	}
	return send(&runnerv1.PlanAndApplyResponse{Event: &runnerv1.PlanAndApplyResponse_ApplyResult{ApplyResult: &runnerv1.ApplyResult{PlanId: res.PlanID}}})
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
		return statusError(codes.InvalidArgument, runner.ReasonInvalidArgument, fmt.Sprintf("unknown plan format %v", req.GetFormat()))
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
	if err := s.exec.ApplyWith(stream.Context(), tf.ApplyOptions{PlanID: req.GetPlanId(), Parallelism: int(req.GetParallelism())}, logf); err != nil {
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
			n := min(len(value), runner.ChunkSize)
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
