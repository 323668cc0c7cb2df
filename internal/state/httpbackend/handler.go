// Package httpbackend serves a state.Store as the Terraform/OpenTofu "http"
// backend at /state/{namespace}/{stack}/{workspace}:
//
//	GET     200 with the state, 204 when there is none
//	POST    store a new state; ?ID=<lock id> must name the held lock
//	DELETE  remove state, history and lock (controller identity only)
//	LOCK    take the lock (JSON lock info body); 423 + holder's lock info when held
//	UNLOCK  release it (JSON body with the ID); 423 + holder's info for another ID
//
// A write that does not follow from the stored state (lower serial, other
// lineage) is refused with 409 and a plain-text reason. Access is decided by
// the client certificate's identity: the controller may use every state, a
// runner only its own Stack's. A tofu configuration for a runner:
//
//	terraform {
//	  backend "http" {
//	    address        = "https://<advertised>/state/<ns>/<stack>/<workspace>"
//	    lock_address   = "https://<advertised>/state/<ns>/<stack>/<workspace>"
//	    unlock_address = "https://<advertised>/state/<ns>/<stack>/<workspace>"
//	    client_certificate_pem    = "<runner leaf>"
//	    client_private_key_pem    = "<runner key>"
//	    client_ca_certificate_pem = "<CA bundle>"
//	  }
//	}
//
// (the same through TF_HTTP_ADDRESS, TF_HTTP_LOCK_ADDRESS, ... environment
// variables). The server certificate must carry the advertised host as a
// DNS or IP SAN: tofu checks hostnames.
package httpbackend

import (
	"crypto/md5" //nolint:gosec // Content-MD5 is what the tofu http backend sends; it checks transport integrity only.
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/state"
)

// PathPrefix is where states are served.
const PathPrefix = "/state/"

// Methods of the lock protocol (tofu's defaults for lock_method and unlock_method).
const (
	MethodLock   = "LOCK"
	MethodUnlock = "UNLOCK"
)

// DefaultMaxStateBytes bounds a state upload. States of large estates reach
// tens of MiB; the stores handle far more than the 1 MiB Secret limit.
const DefaultMaxStateBytes = 256 << 20

const maxLockBodyBytes = 1 << 20

// IdentityFunc returns the verified identity of a request's client.
type IdentityFunc func(r *http.Request) (pki.Identity, error)

// Handler serves the http backend protocol over a Store.
type Handler struct {
	Store state.Store
	// Identify defaults to pki.IdentityFromRequest.
	Identify IdentityFunc
	// MaxStateBytes defaults to DefaultMaxStateBytes.
	MaxStateBytes int64
	Log           logr.Logger
}

// Address returns the backend address of key under baseURL (the advertised
// URL of the state server), for address, lock_address and unlock_address.
func Address(baseURL string, key state.Key) string {
	return strings.TrimRight(baseURL, "/") + PathPrefix + url.PathEscape(key.Namespace) + "/" + url.PathEscape(key.Stack) + "/" + url.PathEscape(key.Workspace)
}

// ParsePath reads the Key from a request path.
func ParsePath(escapedPath string) (state.Key, error) {
	rest, ok := strings.CutPrefix(escapedPath, PathPrefix)
	if !ok {
		return state.Key{}, errors.New("path must start with " + PathPrefix)
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 3 {
		return state.Key{}, errors.New("path must be /state/{namespace}/{stack}/{workspace}")
	}
	for i, p := range parts {
		unescaped, err := url.PathUnescape(p)
		if err != nil {
			return state.Key{}, fmt.Errorf("path segment %d is not valid URL encoding", i+1)
		}
		parts[i] = unescaped
	}
	key := state.Key{Namespace: parts[0], Stack: parts[1], Workspace: parts[2]}
	return key, key.Validate()
}

// authorize lets the controller use every state and a runner only its own Stack's.
func authorize(id pki.Identity, key state.Key, method string) error {
	if id == pki.ControllerIdentity {
		return nil
	}
	ns, stack, _, ok := id.Runner()
	if !ok {
		return fmt.Errorf("identity %s may not use the state server", id)
	}
	if ns != key.Namespace || stack != key.Stack {
		return fmt.Errorf("identity %s may not use the state of %s/%s", id, key.Namespace, key.Stack)
	}
	if method == http.MethodDelete {
		return fmt.Errorf("identity %s may not delete state: only the controller may", id)
	}
	return nil
}

// statusRecorder keeps the response code for the access log.
type statusRecorder struct {
	http.ResponseWriter
	code  int
	bytes int64
}

func (w *statusRecorder) WriteHeader(code int) { w.code = code; w.ResponseWriter.WriteHeader(code) }
func (w *statusRecorder) Write(b []byte) (int, error) {
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	start := time.Now()
	w := &statusRecorder{ResponseWriter: rw, code: http.StatusOK}
	identify := h.Identify
	if identify == nil {
		identify = pki.IdentityFromRequest
	}
	id, err := identify(r)
	var key state.Key
	defer func() {
		observe(r.Method, w.code, time.Since(start))
		// Never the body: states hold secrets.
		h.Log.V(1).Info("state request", "method", r.Method, "state", key.String(), "identity", string(id), "code", w.code, "requestBytes", r.ContentLength, "responseBytes", w.bytes, "duration", time.Since(start).String())
	}()
	if err != nil {
		http.Error(w, "a client certificate with a Terrace identity is required", http.StatusUnauthorized)
		return
	}
	key, err = ParsePath(r.URL.EscapedPath())
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	if err := authorize(id, key, r.Method); err != nil {
		http.Error(w, err.Error(), http.StatusForbidden)
		return
	}
	switch r.Method {
	case http.MethodGet:
		h.get(w, r, key)
	case http.MethodPost, http.MethodPut:
		h.put(w, r, key)
	case http.MethodDelete:
		h.delete(w, r, key)
	case MethodLock:
		h.lock(w, r, key)
	case MethodUnlock:
		h.unlock(w, r, key)
	default:
		w.Header().Set("Allow", "GET, POST, DELETE, LOCK, UNLOCK")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	}
}

func (h *Handler) get(w http.ResponseWriter, r *http.Request, key state.Key) {
	st, err := h.Store.Get(r.Context(), key)
	if errors.Is(err, state.ErrNotFound) {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if err != nil {
		h.fail(w, r, key, err)
		return
	}
	sum := md5.Sum(st.Data) //nolint:gosec // see import
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-MD5", base64.StdEncoding.EncodeToString(sum[:]))
	w.Header().Set("ETag", strconv.Quote(strconv.FormatInt(int64(st.Version), 10)))
	w.Header().Set("Content-Length", strconv.Itoa(len(st.Data)))
	_, _ = w.Write(st.Data)
}

func (h *Handler) put(w http.ResponseWriter, r *http.Request, key state.Key) {
	limit := h.MaxStateBytes
	if limit <= 0 {
		limit = DefaultMaxStateBytes
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			http.Error(w, fmt.Sprintf("state is larger than the server's limit of %d bytes", limit), http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "failed to read the request body", http.StatusBadRequest)
		return
	}
	if want := r.Header.Get("Content-MD5"); want != "" {
		sum := md5.Sum(body) //nolint:gosec // see import
		if base64.StdEncoding.EncodeToString(sum[:]) != want {
			http.Error(w, "Content-MD5 does not match the body", http.StatusBadRequest)
			return
		}
	}
	meta, err := h.Store.Put(r.Context(), key, body, state.PutOptions{LockID: r.URL.Query().Get("ID")})
	if err != nil {
		h.fail(w, r, key, err)
		return
	}
	w.Header().Set("ETag", strconv.Quote(strconv.FormatInt(int64(meta.Version), 10)))
	w.WriteHeader(http.StatusOK)
}

func (h *Handler) delete(w http.ResponseWriter, r *http.Request, key state.Key) {
	held, err := h.Store.GetLock(r.Context(), key)
	if err != nil {
		h.fail(w, r, key, err)
		return
	}
	if err := state.CheckLock(key.String(), held, r.URL.Query().Get("ID")); err != nil && held != nil {
		h.fail(w, r, key, err)
		return
	}
	if err := h.Store.Delete(r.Context(), key); err != nil {
		h.fail(w, r, key, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func readLockInfo(r *http.Request) (state.LockInfo, error) {
	var info state.LockInfo
	body, err := io.ReadAll(io.LimitReader(r.Body, maxLockBodyBytes+1))
	if err != nil || len(body) > maxLockBodyBytes {
		return info, errors.New("failed to read the lock info body (at most 1 MiB)")
	}
	// Unmarshal, not a Decoder: the body must be one JSON value, nothing after it.
	if err := json.Unmarshal(body, &info); err != nil {
		return info, errors.New("lock info must be one JSON object like tofu sends")
	}
	if info.ID == "" {
		return info, errors.New("lock info has no ID")
	}
	return info, nil
}

func (h *Handler) lock(w http.ResponseWriter, r *http.Request, key state.Key) {
	info, err := readLockInfo(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if info.Path == "" {
		info.Path = key.String()
	}
	if err := h.Store.Lock(r.Context(), key, info); err != nil {
		h.fail(w, r, key, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (h *Handler) unlock(w http.ResponseWriter, r *http.Request, key state.Key) {
	info, err := readLockInfo(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if err := h.Store.Unlock(r.Context(), key, info.ID); err != nil {
		h.fail(w, r, key, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// fail maps store errors to the protocol's status codes.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, key state.Key, err error) {
	var locked *state.LockedError
	var conflict *state.ConflictError
	switch {
	case errors.As(err, &locked) && locked.Holder != nil:
		// tofu reads the holder's lock info from the body of a 423.
		raw, _ := json.Marshal(locked.Holder)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusLocked)
		_, _ = w.Write(raw)
	case errors.As(err, &locked):
		http.Error(w, locked.Error(), http.StatusConflict)
	case errors.As(err, &conflict):
		http.Error(w, conflict.Error(), http.StatusConflict)
	case errors.Is(err, state.ErrMigrated):
		http.Error(w, err.Error(), http.StatusConflict)
	case errors.Is(err, state.ErrInvalidState):
		http.Error(w, err.Error(), http.StatusBadRequest)
	case r.Context().Err() != nil:
		http.Error(w, "request cancelled", http.StatusServiceUnavailable)
	default:
		h.Log.Error(err, "state request failed", "method", r.Method, "state", key.String())
		http.Error(w, "internal error while handling the state; see the controller's log", http.StatusInternalServerError)
	}
}
