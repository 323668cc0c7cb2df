// Package client is the Go client of Terrace's Installations API
// (terrace.api.v1.InstallationService), for tools that create and follow
// installations without kubectl. It adds to the generated connect client
// what every caller needs: the bearer token on each call, the server's CA,
// the choice of protocol, and waiting for an installation through Watch.
//
//	c, err := client.New("https://terrace-api.team.svc", client.Options{
//		Token:   client.StaticToken(token),
//		RootCAs: pool,
//	})
//	in, err := c.Create(ctx, connect.NewRequest(&apiv1.CreateRequest{Name: "web", ...}))
//	in, err = c.WaitFor(ctx, "", "web", client.Ready)
package client

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	apiv1 "github.com/terrace-dev/terrace/proto/terrace/api/v1"
	"github.com/terrace-dev/terrace/proto/terrace/api/v1/apiv1connect"
)

// Protocol is how the client speaks to the server; every one is served on
// the same port.
type Protocol string

const (
	// GRPC is gRPC over HTTP/2 (the default).
	GRPC Protocol = "grpc"
	// GRPCWeb is gRPC-Web, over HTTP/1.1 or HTTP/2.
	GRPCWeb Protocol = "grpc-web"
	// Connect is the Connect protocol with binary messages.
	Connect Protocol = "connect"
	// ConnectJSON is the Connect protocol with JSON messages, as a plain
	// HTTP POST (what curl or a browser sends).
	ConnectJSON Protocol = "connect-json"
)

// TokenSource returns the bearer token for a call: a Kubernetes token of the
// cluster the call targets.
type TokenSource func(ctx context.Context) (string, error)

// StaticToken always returns token.
func StaticToken(token string) TokenSource {
	return func(context.Context) (string, error) { return token, nil }
}

// Options configure a Client.
type Options struct {
	// Token is asked for the bearer token of every call; required.
	Token TokenSource
	// RootCAs are the CAs trusted for the server's certificate; the
	// system's when nil.
	RootCAs *x509.CertPool
	// Protocol is GRPC when empty.
	Protocol Protocol
	// HTTPClient replaces the client built from RootCAs (it must speak
	// HTTP/2 for GRPC).
	HTTPClient *http.Client
}

// Client is an InstallationService client. The generated methods are
// promoted; each call carries the bearer token.
type Client struct {
	apiv1connect.InstallationServiceClient
}

// New returns a client of the server at baseURL (https://host:port).
func New(baseURL string, opts Options) (*Client, error) {
	if opts.Token == nil {
		return nil, errors.New("a token source is required: the API acts with the caller's own Kubernetes token")
	}
	if !strings.HasPrefix(baseURL, "https://") {
		return nil, fmt.Errorf("the API URL %q must start with https://: the API carries bearer tokens and is served over TLS only", baseURL)
	}
	httpClient := opts.HTTPClient
	if httpClient == nil {
		httpClient = &http.Client{Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{RootCAs: opts.RootCAs, MinVersion: tls.VersionTLS12},
			ForceAttemptHTTP2: true,
			IdleConnTimeout:   90 * time.Second,
		}}
	}
	options := []connect.ClientOption{connect.WithInterceptors(bearer(opts.Token))}
	switch opts.Protocol {
	case "", GRPC:
		options = append(options, connect.WithGRPC())
	case GRPCWeb:
		options = append(options, connect.WithGRPCWeb())
	case Connect:
	case ConnectJSON:
		options = append(options, connect.WithProtoJSON())
	default:
		return nil, fmt.Errorf("unknown protocol %q: use grpc, grpc-web, connect or connect-json", opts.Protocol)
	}
	return &Client{InstallationServiceClient: apiv1connect.NewInstallationServiceClient(httpClient, strings.TrimSuffix(baseURL, "/"), options...)}, nil
}

// bearer sets the Authorization header of every call.
type bearer TokenSource

func (b bearer) token(ctx context.Context, header http.Header) error {
	token, err := b(ctx)
	if err != nil {
		return fmt.Errorf("failed to get a bearer token: %w", err)
	}
	header.Set("Authorization", "Bearer "+token)
	return nil
}

func (b bearer) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if err := b.token(ctx, req.Header()); err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

func (b bearer) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		if err := b.token(ctx, conn.RequestHeader()); err != nil {
			return &failedConn{StreamingClientConn: conn, err: err}
		}
		return conn
	}
}

func (b bearer) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// failedConn fails a stream whose token could not be had.
type failedConn struct {
	connect.StreamingClientConn
	err error
}

func (c *failedConn) Send(any) error    { return c.err }
func (c *failedConn) Receive(any) error { return c.err }

// Ready reports whether the installation is Ready at its current generation.
func Ready(in *apiv1.Installation) bool { return in.GetReady() }

// WaitFor follows the installation with Watch until done says so, the
// context ends, or the installation is deleted (an error).
func (c *Client) WaitFor(ctx context.Context, cluster, name string, done func(*apiv1.Installation) bool) (*apiv1.Installation, error) {
	stream, err := c.Watch(ctx, connect.NewRequest(&apiv1.WatchRequest{Cluster: cluster, Name: name}))
	if err != nil {
		return nil, err
	}
	defer func() { _ = stream.Close() }()
	var last *apiv1.Installation
	for stream.Receive() {
		msg := stream.Msg()
		last = msg.GetInstallation()
		if msg.GetDeleted() {
			return last, fmt.Errorf("installation %s was deleted", name)
		}
		if done(last) {
			return last, nil
		}
	}
	if err := stream.Err(); err != nil {
		return last, err
	}
	return last, fmt.Errorf("the watch of installation %s ended", name)
}

// Reason returns the ErrorInfo reason of an error the API returned
// (NOT_FOUND, PLAN_NOT_PENDING, UNKNOWN_CLUSTER, ...), or "".
func Reason(err error) string {
	var cerr *connect.Error
	if !errors.As(err, &cerr) {
		return ""
	}
	for _, d := range cerr.Details() {
		if v, err := d.Value(); err == nil {
			if info, ok := v.(*errdetails.ErrorInfo); ok && info.GetDomain() == "terrace.dev" {
				return info.GetReason()
			}
		}
	}
	return ""
}
