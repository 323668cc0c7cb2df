package apiserver

import (
	"context"
	"errors"
	"time"

	"connectrpc.com/connect"
	"github.com/go-logr/logr"
)

// callInfo is what a call's log line says beyond the procedure; the
// service fills it in as it learns who the caller is.
type callInfo struct {
	name string
	user string
}

type callInfoKey struct{}

func infoOf(ctx context.Context) *callInfo {
	if info, ok := ctx.Value(callInfoKey{}).(*callInfo); ok {
		return info
	}
	return &callInfo{}
}

// callLog bounds each unary call's time, hides unexpected errors from the
// caller, and logs one line per call: procedure, name, user, code and
// duration (never a token, never a value).
type callLog struct {
	log     logr.Logger
	timeout time.Duration
}

func (l *callLog) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		started := time.Now()
		info := &callInfo{}
		ctx, cancel := context.WithTimeout(context.WithValue(ctx, callInfoKey{}, info), l.timeout)
		defer cancel()
		res, err := next(ctx, req)
		err = l.finish(req.Spec().Procedure, req.Peer().Protocol, info, started, err)
		return res, err
	}
}

func (l *callLog) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (l *callLog) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		started := time.Now()
		info := &callInfo{}
		err := next(context.WithValue(ctx, callInfoKey{}, info), conn)
		return l.finish(conn.Spec().Procedure, conn.Peer().Protocol, info, started, err)
	}
}

func (l *callLog) finish(procedure, protocol string, info *callInfo, started time.Time, err error) error {
	var cerr *connect.Error
	if err != nil && !errors.As(err, &cerr) {
		if errors.Is(err, context.Canceled) {
			cerr = connect.NewError(connect.CodeCanceled, err)
		} else if errors.Is(err, context.DeadlineExceeded) {
			cerr = connect.NewError(connect.CodeDeadlineExceeded, errors.New("the request took too long: retry"))
		} else {
			l.log.Error(err, "call failed", "procedure", procedure, "name", info.name)
			cerr = connect.NewError(connect.CodeInternal, errInternal)
		}
		err = cerr
	}
	code := "ok"
	if cerr != nil {
		code = cerr.Code().String()
	}
	l.log.Info("call", "procedure", procedure, "protocol", protocol, "name", info.name, "user", info.user,
		"code", code, "duration", time.Since(started).Round(time.Millisecond).String())
	return err
}
