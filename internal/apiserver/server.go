// Package apiserver serves the Installations API, terrace.api.v1.InstallationService
// (proto/terrace/api/v1): a façade over Stacks for tools and UIs that should
// not need kubectl. An installation is a Stack labelled
// terrace.dev/installation=true whose values live in a Secret it reads
// through varsFrom; the Stack and its status stay the source of truth.
//
// One HTTPS listener answers gRPC, gRPC-Web and Connect (connectrpc.com/connect),
// REST on the paths of the service's google.api.http annotations
// (connectrpc.com/vanguard transcodes them; legacy.go keeps the answers of
// the REST API this service replaced; watch_rest.go streams Watch as
// newline-delimited JSON), gRPC health and server reflection.
//
//	caller, err := apiserver.CallerClient(cfg, scheme)
//	srv := &apiserver.Server{Namespace: ns, Client: own, Caller: caller, Stores: backend.New(caller, resolve), Log: log}
//	err := srv.Serve(ctx, listener, apiserver.TLSFiles{CertFile: crt, KeyFile: key})
package apiserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"
	"connectrpc.com/vanguard"
	"github.com/go-logr/logr"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/backend"
	"github.com/terrace-dev/terrace/proto/terrace/api/v1/apiv1connect"
)

// InstallationLabel marks the Stacks the API serves (value "true").
const InstallationLabel = "terrace.dev/installation"

const (
	// maxBodyBytes bounds a request body; a values Secret cannot hold more anyway.
	maxBodyBytes = 1 << 20
	// defaultRequestTimeout bounds the work of one unary call against the Kubernetes API.
	defaultRequestTimeout = 30 * time.Second
	// shutdownTimeout is how long in-flight requests may finish on shutdown.
	shutdownTimeout = 10 * time.Second
)

// StoreOpener opens the plan and release stores of a namespace;
// *backend.Backends is one.
type StoreOpener interface {
	For(ctx context.Context, namespace string) (*backend.Set, error)
}

// Server is the Installations API of one namespace.
type Server struct {
	// Namespace is where the server runs and where a request acts unless
	// it names another namespace (as the caller, like everything else).
	Namespace string
	// Client acts with the server's own identity, which may only read
	// TerraceConfigs (readiness and where the namespace's state is kept).
	Client client.Client
	// Caller acts as each call's caller (CallerClient): every Kubernetes
	// request made for a call goes through it, with the call's context.
	Caller client.WithWatch
	// TokenAudiences, when set, are audiences one of which a caller's token
	// must also be issued for (its aud claim), besides one the Kubernetes
	// API server accepts; a token for none of them is refused with
	// UNAUTHENTICATED. Empty accepts any token the Kubernetes API accepts.
	TokenAudiences []string
	// Stores opens the namespace's plan and release stores, as the
	// controller does; their Secrets must be read through Caller.
	Stores StoreOpener
	// Log gets one line per call: never a token, never a value.
	Log logr.Logger
	// RequestTimeout bounds each unary call; 30 s when zero.
	RequestTimeout time.Duration
	// Clusters are the other clusters a call may name: the operator
	// namespace's TerraceConfig spec.api.clusters, which the controller
	// passes to the server (`terrace api --clusters`). A namespace's own
	// config registers none: a cluster is where callers' tokens are sent.
	Clusters []terracev1.APICluster
	// StoresFor opens the plan and release stores of a registered cluster
	// (Clusters) through its caller client; without it, plans'
	// readable renderings, releases and outputs there are unavailable.
	StoresFor func(caller client.Client) StoreOpener
	// PodLogs reads runner pods and their logs as the caller
	// (CallerPodLogs), for the console's run log; nil: GetRunLog is UNAVAILABLE.
	PodLogs PodLogReader
	// Console, when set, serves the web console at / (internal/console).
	Console http.Handler

	reviews reviewCache
	remote  remoteSites
}

// TLSFiles are the PEM files of the serving certificate; they are reloaded
// when they change.
type TLSFiles struct {
	CertFile string
	KeyFile  string
}

// Serve serves the API over TLS on ln until ctx ends, then lets in-flight
// requests finish.
func (s *Server) Serve(ctx context.Context, ln net.Listener, files TLSFiles) error {
	watcher, err := certwatcher.New(files.CertFile, files.KeyFile)
	if err != nil {
		_ = ln.Close()
		return fmt.Errorf("failed to load the serving certificate: %w", err)
	}
	handler, err := s.Handler()
	if err != nil {
		_ = ln.Close()
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		if err := watcher.Start(ctx); err != nil {
			s.Log.Error(err, "serving certificate watcher stopped")
		}
	}()
	srv := &http.Server{
		Handler: handler,
		// HTTP/2 is on: gRPC needs it. HTTP/1.1 serves REST, Connect and gRPC-Web.
		TLSConfig: &tls.Config{
			MinVersion:     tls.VersionTLS12,
			GetCertificate: watcher.GetCertificate,
			NextProtos:     []string{"h2", "http/1.1"},
		},
		ReadHeaderTimeout: 10 * time.Second,
		// No ReadTimeout or WriteTimeout: they would cut Watch streams.
		// Unary calls are bounded by RequestTimeout and their bodies by maxBodyBytes.
		IdleTimeout:    120 * time.Second,
		MaxHeaderBytes: 64 << 10,
	}
	served := make(chan error, 1)
	go func() { served <- srv.ServeTLS(ln, "", "") }()
	s.Log.Info("serving the installations api", "address", ln.Addr().String(), "namespace", s.Namespace)
	select {
	case err := <-served:
		return fmt.Errorf("failed to serve the installations api: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, done := context.WithTimeout(context.Background(), shutdownTimeout)
	defer done()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("failed to shut the installations api down: %w", err)
	}
	return nil
}

// Handler routes every protocol. /healthz, /readyz, gRPC health and
// reflection need no token: kubelet and tools probe them.
func (s *Server) Handler() (http.Handler, error) {
	svc := &service{Server: s}
	calls := &callLog{log: s.Log, timeout: s.requestTimeout()}
	options := []connect.HandlerOption{
		connect.WithInterceptors(calls),
		connect.WithReadMaxBytes(maxBodyBytes),
	}
	path, installations := apiv1connect.NewInstallationServiceHandler(svc, options...)
	// The REST codec refuses unknown fields, as the REST API always did, and
	// writes every field, so `"ready": false` is there to read.
	strictJSON := func(res vanguard.TypeResolver) vanguard.Codec {
		return restJSON{&vanguard.JSONCodec{
			MarshalOptions:   protojson.MarshalOptions{Resolver: res, EmitUnpopulated: true},
			UnmarshalOptions: protojson.UnmarshalOptions{Resolver: res},
		}}
	}
	transcoder, err := vanguard.NewTranscoder(
		[]*vanguard.Service{vanguard.NewService(path, installations, vanguard.WithMaxMessageBufferBytes(maxBodyBytes),
			// Binary to the handler: REST bodies are then decoded (and answers
			// encoded) by strictJSON, not passed through to connect's lenient JSON.
			vanguard.WithTargetCodecs(vanguard.CodecProto))},
		vanguard.WithCodec(strictJSON),
		vanguard.WithUnknownHandler(http.HandlerFunc(noSuchEndpoint)),
	)
	if err != nil {
		return nil, fmt.Errorf("failed to set up the REST transcoding of %s: %w", apiv1connect.InstallationServiceName, err)
	}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { writeText(w, "ok") })
	mux.HandleFunc("GET /readyz", s.ready)
	mux.Handle(grpchealth.NewHandler(&healthChecker{server: s}))
	reflector := grpcreflect.NewStaticReflector(apiv1connect.InstallationServiceName, grpchealth.HealthV1ServiceName)
	mux.Handle(grpcreflect.NewHandlerV1(reflector))
	mux.Handle(grpcreflect.NewHandlerV1Alpha(reflector))
	// The service's own paths go straight to connect, which speaks gRPC,
	// gRPC-Web and Connect itself (a plain JSON POST needs no extra header).
	mux.Handle(path, streamable(installations))
	mux.Handle("/v1/", legacyREST(transcoder))
	// Watch as newline-delimited JSON, which the transcoder cannot stream (watch_rest.go).
	mux.Handle(restWatchPattern, s.restWatch(svc, calls))
	if s.Console != nil {
		mux.Handle("/", s.Console)
	} else {
		mux.HandleFunc("/", noSuchEndpoint)
	}
	return bounded(mux), nil
}

// restJSON is vanguard's JSON codec whose refusals of a request body are
// INVALID_ARGUMENT: vanguard passes a body error on a path with parameters
// (PUT /v1/installations/{name}/values) through as INTERNAL.
type restJSON struct{ *vanguard.JSONCodec }

func (c restJSON) Unmarshal(data []byte, msg proto.Message) error {
	if err := c.JSONCodec.Unmarshal(data, msg); err != nil {
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	return nil
}

func (c restJSON) UnmarshalField(data []byte, msg proto.Message, field protoreflect.FieldDescriptor) error {
	if err := c.JSONCodec.UnmarshalField(data, msg, field); err != nil {
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	return nil
}

func (s *Server) requestTimeout() time.Duration {
	if s.RequestTimeout > 0 {
		return s.RequestTimeout
	}
	return defaultRequestTimeout
}

// bounded limits every request body.
func bounded(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, maxBodyBytes+1024)
		next.ServeHTTP(w, r)
	})
}

// streamable lets Watch streams outlive any server-wide write deadline.
func streamable(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/Watch") {
			_ = http.NewResponseController(w).SetWriteDeadline(time.Time{})
		}
		next.ServeHTTP(w, r)
	})
}

func noSuchEndpoint(w http.ResponseWriter, _ *http.Request) {
	writeLegacyError(w, http.StatusNotFound, "", "no such endpoint: see /v1/installations or the "+apiv1connect.InstallationServiceName+" service")
}

// ready answers once the server can reach the Kubernetes API with its own identity.
func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	if err := s.readiness(r.Context()); err != nil {
		s.Log.Error(err, "not ready")
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	writeText(w, "ok")
}

func (s *Server) readiness(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// Its own identity may read only the namespace's TerraceConfig, which need not exist.
	err := s.Client.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: terracev1.TerraceConfigName}, &terracev1.TerraceConfig{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("cannot read the TerraceConfig of namespace %s: %w", s.Namespace, err)
	}
	return nil
}

// healthChecker answers gRPC health checks: the server as a whole ("") and
// the installation service are serving when the server is ready.
type healthChecker struct{ server *Server }

func (h *healthChecker) Check(ctx context.Context, req *grpchealth.CheckRequest) (*grpchealth.CheckResponse, error) {
	switch req.Service {
	case "", apiv1connect.InstallationServiceName:
	default:
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("unknown service %q", req.Service))
	}
	if err := h.server.readiness(ctx); err != nil {
		return &grpchealth.CheckResponse{Status: grpchealth.StatusNotServing}, nil
	}
	return &grpchealth.CheckResponse{Status: grpchealth.StatusServing}, nil
}

func writeText(w http.ResponseWriter, text string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte(text + "\n"))
}

// errInternal is what a caller sees of an unexpected error; the log has the rest.
var errInternal = errors.New("internal error: see the API server's log")
