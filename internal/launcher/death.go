package launcher

import (
	"context"
	"errors"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// deathNoticeWait is how long a call that lost its connection waits for the
// pod's end to be observed. The kubelet (out of memory, activeDeadlineSeconds,
// eviction) or a kill ends the runner's connections at once, while the pod's
// terminated status reaches the informer a moment later: without the wait,
// the run would fail with "error reading from server: EOF" instead of the
// kubelet's reason.
const deathNoticeWait = 5 * time.Second

// awaitDeath waits, after a call failed with err, until the pod's end is
// observed or deathNoticeWait passes, when err says the connection was lost.
func (r *Run) awaitDeath(err error) {
	if err == nil || errors.Is(err, io.EOF) || status.Code(err) != codes.Unavailable || r.ctx.Err() != nil {
		return
	}
	timer := time.NewTimer(deathNoticeWait)
	defer timer.Stop()
	select {
	case <-r.ctx.Done():
	case <-timer.C:
	}
}

// deathNoticingCalls are the run's client interceptors: a call or stream
// that lost its connection returns once the pod's end, if that is why, is
// known to Err (and so to the caller that asks it next).
func (r *Run) deathNoticingCalls() []grpc.DialOption {
	unary := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		r.awaitDeath(err)
		return err
	}
	stream := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		s, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			r.awaitDeath(err)
			return nil, err
		}
		return &deathNoticingStream{ClientStream: s, run: r}, nil
	}
	return []grpc.DialOption{grpc.WithChainUnaryInterceptor(unary), grpc.WithChainStreamInterceptor(stream)}
}

type deathNoticingStream struct {
	grpc.ClientStream
	run *Run
}

func (s *deathNoticingStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	s.run.awaitDeath(err)
	return err
}
