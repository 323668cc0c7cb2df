package apiserver

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"connectrpc.com/connect"
)

// legacyREST keeps the answers of the REST API that the transcoded service
// replaced, where vanguard's REST conventions differ from it: a create is
// 201 and a delete 202 (transcoding answers 200), and an error body is
// {"code": <HTTP status>, "message": ..., "reason": ...} with the status the
// REST API always used (a google.rpc.Status carries the gRPC code instead,
// and FAILED_PRECONDITION would be 400 where the REST API said 409).
func legacyREST(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Cache-Control", "no-store")
		h.Set("X-Content-Type-Options", "nosniff")
		if r.ContentLength > maxBodyBytes {
			writeLegacyError(w, http.StatusRequestEntityTooLarge, "", fmt.Sprintf("the request body is larger than %d bytes", maxBodyBytes))
			return
		}
		lw := &legacyWriter{ResponseWriter: w, success: successStatus(r)}
		next.ServeHTTP(lw, r)
		lw.finish()
	})
}

// successStatus is the REST API's status of a successful request.
func successStatus(r *http.Request) int {
	path := strings.TrimSuffix(r.URL.Path, "/")
	switch {
	case r.Method == http.MethodPost && path == "/v1/installations":
		return http.StatusCreated
	case r.Method == http.MethodDelete && strings.Count(path, "/") == 3 && strings.HasPrefix(path, "/v1/installations/"):
		return http.StatusAccepted
	}
	return http.StatusOK
}

// legacyWriter passes successes through with the REST API's status and
// holds an error body back to rewrite it.
type legacyWriter struct {
	http.ResponseWriter
	success int
	status  int
	errBody *bytes.Buffer
}

func (lw *legacyWriter) WriteHeader(code int) {
	if lw.status != 0 {
		return
	}
	lw.status = code
	if code >= http.StatusBadRequest {
		lw.errBody = &bytes.Buffer{}
		return
	}
	if code == http.StatusOK {
		code = lw.success
	}
	lw.ResponseWriter.WriteHeader(code)
}

func (lw *legacyWriter) Write(b []byte) (int, error) {
	if lw.status == 0 {
		lw.WriteHeader(http.StatusOK)
	}
	if lw.errBody != nil {
		return lw.errBody.Write(b)
	}
	return lw.ResponseWriter.Write(b)
}

// Flush lets a streamed success through.
func (lw *legacyWriter) Flush() {
	if f, ok := lw.ResponseWriter.(http.Flusher); ok && lw.errBody == nil {
		f.Flush()
	}
}

// finish writes an error held back, in the REST API's shape.
func (lw *legacyWriter) finish() {
	if lw.errBody == nil {
		return
	}
	var st struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
		Details []struct {
			Type   string `json:"@type"`
			Reason string `json:"reason"`
		} `json:"details"`
	}
	status, message, reason := lw.status, strings.TrimSpace(lw.errBody.String()), ""
	if err := json.Unmarshal(lw.errBody.Bytes(), &st); err == nil && st.Code != 0 {
		status, message = legacyStatus(connect.Code(st.Code), lw.status), st.Message
		for _, d := range st.Details {
			if strings.HasSuffix(d.Type, "google.rpc.ErrorInfo") {
				reason = d.Reason
			}
		}
	}
	lw.Header().Del("Content-Encoding")
	writeLegacyError(lw.ResponseWriter, status, reason, message)
}

// legacyStatus is the HTTP status the REST API gave each kind of error.
func legacyStatus(code connect.Code, transcoded int) int {
	switch code {
	case connect.CodeInvalidArgument, connect.CodeOutOfRange:
		return http.StatusBadRequest
	case connect.CodeUnauthenticated:
		return http.StatusUnauthorized
	case connect.CodePermissionDenied:
		return http.StatusForbidden
	case connect.CodeNotFound:
		return http.StatusNotFound
	case connect.CodeAlreadyExists, connect.CodeAborted, connect.CodeFailedPrecondition:
		return http.StatusConflict
	case connect.CodeResourceExhausted:
		return http.StatusRequestEntityTooLarge
	case connect.CodeUnavailable:
		return http.StatusServiceUnavailable
	case connect.CodeDeadlineExceeded:
		return http.StatusGatewayTimeout
	case connect.CodeInternal, connect.CodeUnknown, connect.CodeDataLoss:
		return http.StatusInternalServerError
	}
	return transcoded
}

// legacyError is the body of every REST error.
type legacyError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Reason  string `json:"reason,omitempty"`
}

func writeLegacyError(w http.ResponseWriter, status int, reason, message string) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	if status == http.StatusUnauthorized {
		h.Set("WWW-Authenticate", `Bearer realm="terrace"`)
	}
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(legacyError{Code: status, Message: message, Reason: reason})
}
