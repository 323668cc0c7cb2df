package apiserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"

	apiv1 "github.com/terrace-dev/terrace/proto/terrace/api/v1"
	"github.com/terrace-dev/terrace/proto/terrace/api/v1/apiv1connect"
)

// The REST route of Watch: GET /v1/installations/{name}/watch[?cluster=…&namespace=…]
// answers application/x-ndjson, one line per event (a WatchResponse in the
// REST API's JSON), each flushed as it is sent, until the installation is
// deleted or the caller goes away. It is served here rather than by the
// transcoder: vanguard (v0.4.0, the latest) supports REST server streams
// only for google.api.HttpBody responses and even then holds the whole
// response back until the stream ends, since its REST protocol puts the
// status in the headers; a watch would show nothing until it was over.

const (
	restWatchPattern = "GET /v1/installations/{name}/watch"
	// ndjson is the media type of the REST watch: newline-delimited JSON.
	ndjson = "application/x-ndjson"
)

// watchLineJSON writes events as the REST API writes answers: every field,
// lowerCamelCase names, on one line (protojson adds no newline without
// Multiline).
var watchLineJSON = protojson.MarshalOptions{EmitUnpopulated: true}

// restWatch serves restWatchPattern with the same Watch as gRPC and
// Connect, logged as every call is. An error before the first line is the
// REST API's JSON error; one after it is a last line {"error": {…}}, since
// the status has been sent by then.
func (s *Server) restWatch(svc *service, log *callLog) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started, info := time.Now(), &callInfo{}
		lines := &watchLines{w: w}
		err := lines.watch(r, func(ctx context.Context, req *connect.Request[apiv1.WatchRequest]) error {
			return svc.watch(context.WithValue(ctx, callInfoKey{}, info), req, lines.send)
		})
		err = log.finish(apiv1connect.InstallationServiceWatchProcedure, "rest", info, started, err)
		if err == nil || errors.Is(r.Context().Err(), context.Canceled) {
			return
		}
		var cerr *connect.Error
		if !errors.As(err, &cerr) {
			cerr = connect.NewError(connect.CodeInternal, errInternal)
		}
		if !lines.started {
			writeLegacyError(w, legacyStatus(cerr.Code(), http.StatusInternalServerError), reasonOf(cerr), cerr.Message())
			return
		}
		lines.writeError(cerr)
	})
}

// watchLines writes the events of one REST watch.
type watchLines struct {
	w       http.ResponseWriter
	started bool
}

// watch makes the Watch request of r (its name, ?cluster, ?namespace and headers) and
// runs it; any other query parameter is INVALID_ARGUMENT, as on every REST
// path.
func (l *watchLines) watch(r *http.Request, run func(context.Context, *connect.Request[apiv1.WatchRequest]) error) error {
	query := r.URL.Query()
	for key := range query {
		if key != "cluster" && key != "namespace" {
			return invalid(fmt.Sprintf("unknown query parameter %q: the watch takes only cluster and namespace", key))
		}
	}
	req := connect.NewRequest(&apiv1.WatchRequest{Name: r.PathValue("name"), Cluster: query.Get("cluster"), Namespace: query.Get("namespace")})
	for key, values := range r.Header {
		req.Header()[key] = values
	}
	return run(r.Context(), req)
}

func (l *watchLines) send(ev *apiv1.WatchResponse) error {
	line, err := watchLineJSON.Marshal(ev)
	if err != nil {
		return fmt.Errorf("failed to encode a watch event: %w", err)
	}
	if !l.started {
		h := l.w.Header()
		h.Set("Content-Type", ndjson)
		h.Set("Cache-Control", "no-store")
		h.Set("X-Content-Type-Options", "nosniff")
		l.w.WriteHeader(http.StatusOK)
		l.started = true
	}
	if _, err := l.w.Write(append(line, '\n')); err != nil {
		return err
	}
	return http.NewResponseController(l.w).Flush()
}

// writeError ends a started stream with a line naming the error.
func (l *watchLines) writeError(cerr *connect.Error) {
	line, err := json.Marshal(map[string]legacyError{"error": {
		Code: legacyStatus(cerr.Code(), http.StatusInternalServerError), Message: cerr.Message(), Reason: reasonOf(cerr),
	}})
	if err == nil {
		_, _ = l.w.Write(append(line, '\n'))
		_ = http.NewResponseController(l.w).Flush()
	}
}
