package launcher

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A call that lost its connection returns once the pod's end is known, so
// the caller reads the kubelet's reason from Err instead of a bare EOF; any
// other error returns at once.
func TestLostConnectionWaitsForThePodsEnd(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	r := &Run{ctx: ctx, cancel: cancel}
	term := &TerminatedError{Pod: "ns/pod", Reason: "DeadlineExceeded", Message: "Pod was active on the node longer than the specified deadline"}
	go func() {
		time.Sleep(100 * time.Millisecond)
		r.cancel(term)
	}()
	begin := time.Now()
	r.awaitDeath(status.Error(codes.Unavailable, "error reading from server: EOF"))
	if took := time.Since(begin); took >= deathNoticeWait {
		t.Fatalf("waited %s, the whole deathNoticeWait, though the pod's end came after 100 ms", took)
	}
	var got *TerminatedError
	if !errors.As(r.Err(), &got) || got.Reason != "DeadlineExceeded" {
		t.Fatalf("Err() = %v after the wait, want the pod's end", r.Err())
	}

	for _, err := range []error{io.EOF, status.Error(codes.FailedPrecondition, "plan is stale"), nil} {
		live, stop := context.WithCancelCause(context.Background())
		begin := time.Now()
		(&Run{ctx: live, cancel: stop}).awaitDeath(err)
		if took := time.Since(begin); took > time.Second {
			t.Errorf("awaitDeath(%v) waited %s", err, took)
		}
		stop(nil)
	}
}
