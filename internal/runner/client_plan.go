package runner

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/terrace-dev/terrace/internal/runphase"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// Plan is a saved plan with its redacted JSON.
type Plan struct {
	*runnerv1.PlanResult
	// JSON is the redacted `show -json` of the plan, nil when JSONOmitted.
	JSON []byte
	// JSONOmitted says the JSON was over Limits.PlanJSONBytes and dropped.
	JSONOmitted bool
}

// Plan makes and saves a plan.
func (c *Client) Plan(ctx context.Context, req *runnerv1.PlanRequest, logf LogFunc) (*Plan, error) {
	// Returning early (an answer over a limit) must also end the stream.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.rpc.Plan(ctx, req)
	if err != nil {
		return nil, err
	}
	recv := c.newPlanReceiver()
	for {
		msg, err := stream.Recv()
		if err != nil {
			return nil, endOfStream(err)
		}
		switch ev := msg.GetEvent().(type) {
		case *runnerv1.PlanResponse_Log:
			logTo(logf, ev.Log)
		case *runnerv1.PlanResponse_JsonChunk:
			recv.chunk(ev.JsonChunk)
		case *runnerv1.PlanResponse_Result:
			return recv.result(ev.Result)
		}
	}
}

// planReceiver collects a plan's JSON chunks and its result.
type planReceiver struct {
	js       *boundedBuffer
	received int64
}

func (c *Client) newPlanReceiver() *planReceiver {
	return &planReceiver{js: &boundedBuffer{what: "plan JSON", limit: c.limits.PlanJSONBytes}}
}

func (p *planReceiver) chunk(c []byte) {
	p.received += int64(len(c))
	if p.js != nil && p.js.add(c) != nil {
		p.js = nil // over the limit: the plan is kept, its JSON is not
	}
}

func (p *planReceiver) result(r *runnerv1.PlanResult) (*Plan, error) {
	if p.received != r.GetJsonSize() {
		return nil, fmt.Errorf("plan JSON is %d bytes, the runner announced %d", p.received, r.GetJsonSize())
	}
	if p.js == nil {
		return &Plan{PlanResult: r, JSONOmitted: true}, nil
	}
	return &Plan{PlanResult: r, JSON: p.js.Bytes()}, nil
}

// PlanAndApply makes and saves a plan and, when it has changes, applies it
// in the same runner operation (approvePlan: auto). It returns the plan
// whenever one was made, also when the apply then failed (with the apply's
// error), and whether the plan was applied: a plan without changes is not.
// Unlike Apply after Plan, it needs no SetSensitiveVariables: the plan
// request's variables name what is sensitive. timings, when set, receives
// the plan phase (until the plan's result arrived) and the apply phase.
func (c *Client) PlanAndApply(ctx context.Context, req *runnerv1.PlanRequest, logf LogFunc, timings *runphase.Timings) (plan *Plan, applied bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if timings == nil {
		timings = &runphase.Timings{}
	}
	planned := timings.Start(runphase.Plan)
	defer planned()
	var appliedPhase func()
	defer func() {
		if appliedPhase != nil {
			appliedPhase()
		}
	}()
	stream, err := c.rpc.PlanAndApply(ctx, req)
	if err != nil {
		return nil, false, err
	}
	recv := c.newPlanReceiver()
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) && plan != nil && !plan.GetHasChanges() {
			return plan, false, nil
		}
		if err != nil {
			return plan, false, endOfStream(err)
		}
		switch ev := msg.GetEvent().(type) {
		case *runnerv1.PlanAndApplyResponse_Log:
			logTo(logf, ev.Log)
		case *runnerv1.PlanAndApplyResponse_JsonChunk:
			recv.chunk(ev.JsonChunk)
		case *runnerv1.PlanAndApplyResponse_PlanResult:
			if plan, err = recv.result(ev.PlanResult); err != nil {
				return nil, false, err
			}
			planned()
			if plan.GetHasChanges() {
				appliedPhase = timings.Start(runphase.Apply)
			}
		case *runnerv1.PlanAndApplyResponse_ApplyResult:
			if plan == nil || ev.ApplyResult.GetPlanId() != plan.GetPlanId() {
				return plan, false, errors.New("runner reported an apply without its plan")
			}
			return plan, true, nil
		}
	}
}

// ShowPlan returns a saved plan, redacted, as JSON or human text.
func (c *Client) ShowPlan(ctx context.Context, planID string, format runnerv1.PlanFormat) ([]byte, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.rpc.ShowPlan(ctx, &runnerv1.ShowPlanRequest{PlanId: planID, Format: format})
	if err != nil {
		return nil, err
	}
	out := boundedBuffer{what: "readable plan", limit: c.limits.ShowPlanBytes}
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out.Bytes(), nil
		}
		if err != nil {
			return nil, err
		}
		if err := out.add(msg.GetChunk()); err != nil {
			return nil, err
		}
	}
}

// Apply applies exactly the saved plan planID.
func (c *Client) Apply(ctx context.Context, planID string, logf LogFunc) error {
	return c.ApplyWith(ctx, &runnerv1.ApplyRequest{PlanId: planID}, logf)
}

// ApplyWith is Apply with the request's options (parallelism).
func (c *Client) ApplyWith(ctx context.Context, req *runnerv1.ApplyRequest, logf LogFunc) error {
	stream, err := c.rpc.Apply(ctx, req)
	if err != nil {
		return err
	}
	return untilResult(stream, logf)
}

// DownloadPlan writes the binary plan file planID to w and returns its
// header (digest and size), after checking both. A file over
// Limits.PlanFileBytes is refused before any of it is read.
func (c *Client) DownloadPlan(ctx context.Context, planID string, w io.Writer) (*runnerv1.PlanFileHeader, error) {
	return c.DownloadPlanUpTo(ctx, planID, c.limits.PlanFileBytes, w)
}

// DownloadPlanUpTo is DownloadPlan bounded by limit instead of
// Limits.PlanFileBytes, for a caller that passes the file on as it comes
// rather than holding it (the state tofu could not save, which is larger
// than the state server's limit by definition).
func (c *Client) DownloadPlanUpTo(ctx context.Context, planID string, limit int64, w io.Writer) (*runnerv1.PlanFileHeader, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.rpc.DownloadPlan(ctx, &runnerv1.DownloadPlanRequest{PlanId: planID})
	if err != nil {
		return nil, err
	}
	first, err := stream.Recv()
	if err != nil {
		return nil, endOfStream(err)
	}
	header := first.GetHeader()
	if header == nil {
		return nil, errors.New("runner sent a plan without header")
	}
	if header.GetSize() > limit {
		return nil, &TooLargeError{What: "plan file", Limit: limit}
	}
	h := newDigester()
	var n int64
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		chunk := msg.GetChunk()
		if n+int64(len(chunk)) > header.GetSize() {
			// The runner announced less than it sends: stop at the announcement.
			return nil, fmt.Errorf("plan %s is longer than the %d bytes its header announced", planID, header.GetSize())
		}
		h.Write(chunk)
		if _, err := w.Write(chunk); err != nil {
			return nil, fmt.Errorf("failed to write plan %s: %w", planID, err)
		}
		n += int64(len(chunk))
	}
	if n != header.GetSize() || h.digest() != header.GetDigest() {
		return nil, fmt.Errorf("plan %s arrived incomplete: %d of %d bytes, digest %s, expected %s", planID, n, header.GetSize(), h.digest(), header.GetDigest())
	}
	return header, nil
}

// UploadPlan gives a fresh runner a plan file kept by the controller
// (after Upload/Fetch and Init of the same source), so Apply can apply it.
func (c *Client) UploadPlan(ctx context.Context, planID, digest string, r io.Reader) error {
	stream, err := c.rpc.UploadPlan(ctx)
	if err != nil {
		return err
	}
	header := &runnerv1.PlanFileHeader{PlanId: planID, Digest: digest}
	if err := stream.Send(&runnerv1.UploadPlanRequest{Part: &runnerv1.UploadPlanRequest_Header{Header: header}}); err != nil {
		return closeAndRecvErr(stream.CloseAndRecv, err)
	}
	if err := sendReader(r, func(chunk []byte) error {
		return stream.Send(&runnerv1.UploadPlanRequest{Part: &runnerv1.UploadPlanRequest_Chunk{Chunk: chunk}})
	}); err != nil {
		return closeAndRecvErr(stream.CloseAndRecv, err)
	}
	_, err = stream.CloseAndRecv()
	return err
}
