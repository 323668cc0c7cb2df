package runner

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/tf"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// Client is the controller's handle on one runner.
type Client struct {
	conn   *grpc.ClientConn
	rpc    runnerv1.RunnerServiceClient
	limits Limits
}

// Limits bound what the controller holds in memory from one runner. A
// runner runs a tenant's module and image, so it is not trusted to keep
// its answers small: an answer over a limit ends the call with a
// *TooLargeError before more of it is read, except the plan JSON, which is
// dropped (Plan.JSONOmitted) and the plan kept.
type Limits struct {
	// PlanJSONBytes bounds the redacted `show -json` kept with a plan; it
	// is about ten times the plan's largest values, so it easily outgrows
	// a state the state server accepts.
	PlanJSONBytes int64
	// ShowPlanBytes bounds a readable plan (ShowPlan).
	ShowPlanBytes int64
	// OutputsBytes bounds all output values and types together.
	OutputsBytes int64
	// PlanFileBytes bounds a binary plan file (DownloadPlan).
	PlanFileBytes int64
}

// DefaultLimits keep --max-concurrent-runs (4) runs at their worst, about
// 150 MiB each with the copies the plan store makes, inside the memory
// budget of config/manager; a plan of thousands of resources, or with an
// output of several MiB (which its JSON repeats a few times), stays under them.
func DefaultLimits() Limits {
	return Limits{PlanJSONBytes: 32 << 20, ShowPlanBytes: 32 << 20, OutputsBytes: 8 << 20, PlanFileBytes: 32 << 20}
}

// TooLargeError says a runner's answer went over one of the Limits.
type TooLargeError struct {
	// What was too large: "plan JSON", "readable plan", "outputs", "plan file".
	What  string
	Limit int64
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("the runner's %s is larger than the controller's limit of %d bytes; reduce what the module plans or outputs (split the Stack)", e.What, e.Limit)
}

// boundedBuffer collects a runner's answer up to a limit.
type boundedBuffer struct {
	bytes.Buffer
	what  string
	limit int64
}

func (b *boundedBuffer) add(p []byte) error {
	if int64(b.Len())+int64(len(p)) > b.limit {
		return &TooLargeError{What: b.what, Limit: b.limit}
	}
	b.Write(p)
	return nil
}

// SetLimits replaces the DefaultLimits of c; zero fields keep their default.
func (c *Client) SetLimits(l Limits) {
	d := DefaultLimits()
	if l.PlanJSONBytes <= 0 {
		l.PlanJSONBytes = d.PlanJSONBytes
	}
	if l.ShowPlanBytes <= 0 {
		l.ShowPlanBytes = d.ShowPlanBytes
	}
	if l.OutputsBytes <= 0 {
		l.OutputsBytes = d.OutputsBytes
	}
	if l.PlanFileBytes <= 0 {
		l.PlanFileBytes = d.PlanFileBytes
	}
	c.limits = l
}

// ClientTLSConfig is the controller's side of mutual TLS with one runner:
// it presents the controller's certificate and accepts only the runner
// identity expected for that run.
func ClientTLSConfig(controller pki.CertificateSource, trust pki.TrustSource, runner pki.Identity) *tls.Config {
	return pki.ClientTLSConfig(controller, trust, runner)
}

// ConnectBackoff is how the client retries connecting to a runner that
// does not listen yet. The launcher dials as soon as the runner's container
// runs, a few milliseconds before it binds its port, so the first retries
// come quickly; gRPC's default (1 s, growing to 2 minutes) would make every
// run wait a second for nothing.
var ConnectBackoff = backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second}

// Dial connects to the runner at addr (host:port) with tlsConfig (see
// ClientTLSConfig). The connection is made lazily; WaitReady waits for it,
// retrying with ConnectBackoff.
func Dial(_ context.Context, addr string, tlsConfig *tls.Config, opts ...grpc.DialOption) (*Client, error) {
	opts = append([]grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(tlsConfig)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 20 * time.Second, PermitWithoutStream: true}),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: ConnectBackoff, MinConnectTimeout: 5 * time.Second}),
	}, opts...)
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("failed to create a runner client for %s: %w", addr, err)
	}
	return &Client{conn: conn, rpc: runnerv1.NewRunnerServiceClient(conn), limits: DefaultLimits()}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// RPC is the raw generated client, for what the methods below do not cover.
func (c *Client) RPC() runnerv1.RunnerServiceClient { return c.rpc }

// WaitReady blocks until the runner answers its health check as serving,
// or ctx ends (give it a deadline: a refused handshake is retried).
func (c *Client) WaitReady(ctx context.Context) error {
	resp, err := healthpb.NewHealthClient(c.conn).Check(ctx, &healthpb.HealthCheckRequest{Service: ServiceName}, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("failed to reach the runner: %w", err)
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("runner is %s", resp.GetStatus())
	}
	return nil
}

// Health checks the runner once, without waiting for the connection.
func (c *Client) Health(ctx context.Context) error {
	resp, err := healthpb.NewHealthClient(c.conn).Check(ctx, &healthpb.HealthCheckRequest{Service: ServiceName})
	if err != nil {
		return err
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("runner is %s", resp.GetStatus())
	}
	return nil
}

// LogFunc receives each (redacted) line tofu printed, as it happens.
type LogFunc func(line string)

func logTo(logf LogFunc, l *runnerv1.LogLine) {
	if logf != nil && l != nil {
		logf(l.GetText())
	}
}

// Init initialises the module.
func (c *Client) Init(ctx context.Context, req *runnerv1.InitRequest, logf LogFunc) (*runnerv1.InitResult, error) {
	stream, err := c.rpc.Init(ctx, req)
	if err != nil {
		return nil, err
	}
	for {
		msg, err := stream.Recv()
		if err != nil {
			return nil, endOfStream(err)
		}
		if r := msg.GetResult(); r != nil {
			return r, nil
		}
		logTo(logf, msg.GetLog())
	}
}

// endOfStream turns a stream that closed without a result into an error.
func endOfStream(err error) error {
	if errors.Is(err, io.EOF) {
		return errors.New("runner closed the stream without a result")
	}
	return err
}

// Output is one root output; Value is in clear even when Sensitive.
type Output struct {
	Sensitive bool
	Type      json.RawMessage
	Value     json.RawMessage
}

// Outputs returns every root output.
func (c *Client) Outputs(ctx context.Context) (map[string]Output, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.rpc.Output(ctx, &runnerv1.OutputRequest{})
	if err != nil {
		return nil, err
	}
	outs := map[string]Output{}
	values := map[string]*bytes.Buffer{}
	var total int64 // names, types and values, all outputs together
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		buf, ok := values[msg.GetName()]
		if !ok {
			buf = &bytes.Buffer{}
			values[msg.GetName()] = buf
			outs[msg.GetName()] = Output{Sensitive: msg.GetSensitive(), Type: msg.GetTypeJson()}
			total += int64(len(msg.GetName()) + len(msg.GetTypeJson()))
		}
		if total += int64(len(msg.GetValueChunk())); total > c.limits.OutputsBytes {
			return nil, &TooLargeError{What: "outputs", Limit: c.limits.OutputsBytes}
		}
		buf.Write(msg.GetValueChunk())
	}
	for name, buf := range values {
		o := outs[name]
		o.Value = buf.Bytes()
		outs[name] = o
	}
	return outs, nil
}

// ErrStateEncrypted says a state is encrypted by tofu itself, so only the
// runner can read its outputs (OutputsFrom asks it then).
var ErrStateEncrypted = tf.ErrStateEncrypted

// OutputsFromState reads every root output, with its sensitivity, from a
// state file the controller holds (as the state server stored it), within
// the client's Limits.OutputsBytes: no runner call and no tofu process. A
// state encrypted by tofu gives ErrStateEncrypted.
func (c *Client) OutputsFromState(state []byte) (map[string]Output, error) {
	values, err := tf.OutputsFromState(state)
	if err != nil {
		return nil, err
	}
	outs := make(map[string]Output, len(values))
	var total int64
	for name, v := range values {
		if total += int64(len(name) + len(v.Type) + len(v.Value)); total > c.limits.OutputsBytes {
			return nil, &TooLargeError{What: "outputs", Limit: c.limits.OutputsBytes}
		}
		outs[name] = Output{Sensitive: v.Sensitive, Type: v.Type, Value: v.Value}
	}
	return outs, nil
}

// OutputsFrom returns every root output: from state, the state file the
// controller holds after the run's apply, when it can read it; from the
// runner (`tofu output`) when state is nil or encrypted by tofu.
func (c *Client) OutputsFrom(ctx context.Context, state []byte) (map[string]Output, error) {
	if state != nil {
		outs, err := c.OutputsFromState(state)
		if !errors.Is(err, ErrStateEncrypted) {
			return outs, err
		}
	}
	return c.Outputs(ctx)
}

// Destroy destroys everything in the state.
func (c *Client) Destroy(ctx context.Context, req *runnerv1.DestroyRequest, logf LogFunc) error {
	stream, err := c.rpc.Destroy(ctx, req)
	if err != nil {
		return err
	}
	return untilResult(stream, logf)
}

// logOrResult is a streamed message of an operation that ends with a
// result and carries nothing else: Apply and Destroy.
type logOrResult[R any] interface {
	GetLog() *runnerv1.LogLine
	GetResult() R
}

// untilResult passes the stream's log lines to logf until its result.
func untilResult[M logOrResult[R], R comparable](stream interface{ Recv() (M, error) }, logf LogFunc) error {
	var none R
	for {
		msg, err := stream.Recv()
		if err != nil {
			return endOfStream(err)
		}
		if msg.GetResult() != none {
			return nil
		}
		logTo(logf, msg.GetLog())
	}
}

// ForceUnlock removes the state lock lockID.
func (c *Client) ForceUnlock(ctx context.Context, lockID string) error {
	_, err := c.rpc.ForceUnlock(ctx, &runnerv1.ForceUnlockRequest{LockId: lockID})
	return err
}
