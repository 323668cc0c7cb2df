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
// runner only its own Stack's, only while its run is the Stack's current
// run (RunChecker), and only under a lock it took itself. A runner is never
// told who holds a lock: its 423s carry a lock info that names nobody.
//
// Every state is held in memory whole while it is served, so sizes are
// bounded: a state over Options.MaxStateBytes is refused with 413, and
// large states in flight share Options.MaxInflightBytes (a namespace at
// most Options.MaxInflightBytesPerNamespace), states up to 1 MiB and lock
// infos Options.MaxSmallInflightBytes (counted as their bytes arrive: an
// announced length allocates nothing); a transfer that finds no room
// within Options.AdmissionWait is answered 503 with Retry-After. A body
// must arrive within Options.BodyTimeout (a second more per MiB), or is
// answered 408. A run holds at most Options.MaxConnectionsPerRun
// connections and a namespace Options.MaxConnectionsPerNamespace (more are
// answered 429 with Retry-After and closed), the server at most
// Options.MaxConnections (more wait to be accepted). A tofu configuration
// for a runner:
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
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
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
const DefaultMaxStateBytes = 64 << 20

// IdentityFunc returns the verified identity of a request's client.
type IdentityFunc func(r *http.Request) (pki.Identity, error)

// Handler serves the http backend protocol over a Store.
type Handler struct {
	Store state.Store
	// Runs tells current runs; without it no runner is accepted.
	Runs RunChecker
	// Identify defaults to pki.IdentityFromRequest.
	Identify IdentityFunc
	// MaxStateBytes defaults to DefaultMaxStateBytes.
	MaxStateBytes int64
	Log           logr.Logger

	limitsOnce sync.Once
	lim        *handlerLimits
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

// statusRecorder keeps the response code for the access log.
type statusRecorder struct {
	http.ResponseWriter
	code  int
	bytes int64
}

func (w *statusRecorder) WriteHeader(code int) { w.code = code; w.ResponseWriter.WriteHeader(code) }

// Unwrap lets http.ResponseController reach the connection's deadlines.
func (w *statusRecorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }
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
	if conns := h.limits().conns; conns != nil {
		if err := conns.admit(r.Context(), id); err != nil {
			h.fail(w, r, id, key, err)
			return
		}
		// A connection answered for the last time counts no more: its
		// client is on a new one while net/http closes it (up to half a
		// second, to avoid a reset).
		defer func() {
			if r.Close || w.Header().Get("Connection") == "close" {
				conns.closing(r.Context())
			}
		}()
	}
	key, err = ParsePath(r.URL.EscapedPath())
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	if err := h.authorize(r.Context(), id, pki.PodUIDFromRequest(r), key, r.Method); err != nil {
		if !errors.Is(err, errForbidden) {
			h.fail(w, r, id, key, err)
			return
		}
		http.Error(w, err.Error(), http.StatusForbidden)
		return
	}
	switch r.Method {
	case http.MethodGet:
		h.get(w, r, id, key)
	case http.MethodPost, http.MethodPut:
		h.put(w, r, id, key)
	case http.MethodDelete:
		h.delete(w, r, id, key)
	case MethodLock:
		h.lock(w, r, id, key)
	case MethodUnlock:
		h.unlock(w, r, id, key)
	default:
		w.Header().Set("Allow", "GET, POST, DELETE, LOCK, UNLOCK")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	}
}

func (h *Handler) get(w http.ResponseWriter, r *http.Request, id pki.Identity, key state.Key) {
	// The size is known before the bytes are loaded: admit them first.
	var release func()
	defer func() {
		if release != nil {
			release()
		}
	}()
	// A run's reads after it took the lock here come from that lock's copy.
	lim := h.limits()
	st, err := state.GetAdmittedBy(r.Context(), h.Store, key, lockOwner(id), func(meta state.StateMeta) error {
		var err error
		if release, err = lim.admissionFor(meta.Size).acquire(r.Context(), key.Namespace, meta.Size); err != nil {
			return err
		}
		_ = http.NewResponseController(w).SetWriteDeadline(lim.transferDeadline(meta.Size))
		return nil
	})
	if errors.Is(err, state.ErrNotFound) {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if err != nil {
		h.fail(w, r, id, key, err)
		return
	}
	sum := md5.Sum(st.Data) //nolint:gosec // see import
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-MD5", base64.StdEncoding.EncodeToString(sum[:]))
	w.Header().Set("ETag", strconv.Quote(strconv.FormatInt(int64(st.Version), 10)))
	w.Header().Set("Content-Length", strconv.Itoa(len(st.Data)))
	_, _ = w.Write(st.Data)
}

func (h *Handler) maxStateBytes() int64 {
	if h.MaxStateBytes <= 0 {
		return DefaultMaxStateBytes
	}
	return h.MaxStateBytes
}

// limits returns the server's limits, or the defaults (without connection
// caps) for a Handler built without NewServer.
func (h *Handler) limits() *handlerLimits {
	h.limitsOnce.Do(func() {
		if h.lim == nil {
			h.lim = newHandlerLimits(DefaultOptions())
		}
	})
	return h.lim
}

// stateBody names a state upload in a 413.
const stateBody = "state"

func (h *Handler) put(w http.ResponseWriter, r *http.Request, id pki.Identity, key state.Key) {
	body, release, err := h.readRequestBody(w, r, key, stateBody, h.maxStateBytes())
	if err != nil {
		h.fail(w, r, id, key, err)
		return
	}
	defer release()
	if want := r.Header.Get("Content-MD5"); want != "" {
		sum := md5.Sum(body) //nolint:gosec // see import
		if base64.StdEncoding.EncodeToString(sum[:]) != want {
			http.Error(w, "Content-MD5 does not match the body", http.StatusBadRequest)
			return
		}
	}
	meta, err := h.Store.Put(r.Context(), key, body, state.PutOptions{LockID: lockIDOf(id, r.URL.Query().Get("ID"))})
	if err != nil {
		h.fail(w, r, id, key, err)
		return
	}
	w.Header().Set("ETag", strconv.Quote(strconv.FormatInt(int64(meta.Version), 10)))
	w.WriteHeader(http.StatusOK)
}

func (h *Handler) delete(w http.ResponseWriter, r *http.Request, id pki.Identity, key state.Key) {
	held, err := h.Store.GetLock(r.Context(), key)
	if err != nil {
		h.fail(w, r, id, key, err)
		return
	}
	if err := state.CheckLock(key.String(), held, r.URL.Query().Get("ID")); err != nil && held != nil {
		h.fail(w, r, id, key, err)
		return
	}
	if err := h.Store.Delete(r.Context(), key); err != nil {
		h.fail(w, r, id, key, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// errInvalidLockInfo marks a lock info body that is not one (400).
var errInvalidLockInfo = errors.New("invalid lock info")

func (h *Handler) readLockInfo(w http.ResponseWriter, r *http.Request, key state.Key) (state.LockInfo, error) {
	var info state.LockInfo
	body, release, err := h.readRequestBody(w, r, key, "lock info", maxLockBodyBytes)
	if err != nil {
		return info, err
	}
	defer release()
	// Unmarshal, not a Decoder: the body must be one JSON value, nothing after it.
	if err := json.Unmarshal(body, &info); err != nil {
		return info, fmt.Errorf("%w: lock info must be one JSON object like tofu sends", errInvalidLockInfo)
	}
	if info.ID == "" {
		return info, fmt.Errorf("%w: lock info has no ID", errInvalidLockInfo)
	}
	return info, nil
}

func (h *Handler) lock(w http.ResponseWriter, r *http.Request, id pki.Identity, key state.Key) {
	info, err := h.readLockInfo(w, r, key)
	if err != nil {
		h.fail(w, r, id, key, err)
		return
	}
	if info.Path == "" {
		info.Path = key.String()
	}
	// Who took the lock is the server's word, never the client's.
	info.Owner = string(id)
	if err := h.Store.Lock(r.Context(), key, info); err != nil {
		h.fail(w, r, id, key, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (h *Handler) unlock(w http.ResponseWriter, r *http.Request, id pki.Identity, key state.Key) {
	info, err := h.readLockInfo(w, r, key)
	if err != nil {
		h.fail(w, r, id, key, err)
		return
	}
	if err := h.Store.Unlock(r.Context(), key, lockIDOf(id, info.ID)); err != nil {
		h.fail(w, r, id, key, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// fail maps store errors to the protocol's status codes.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, id pki.Identity, key state.Key, err error) {
	var locked *state.LockedError
	var conflict *state.ConflictError
	var tooBig *bodyTooLargeError
	switch {
	case errors.Is(err, errTooManyConnections):
		// Before anything is read: the connection goes, the client's
		// others stay. tofu retries a 429 after Retry-After.
		w.Header().Set("Connection", "close")
		w.Header().Set("Retry-After", retryAfterConnections)
		http.Error(w, err.Error(), http.StatusTooManyRequests)
	case errors.As(err, &tooBig) && tooBig.what == stateBody:
		w.Header().Set("Connection", "close")
		http.Error(w, fmt.Sprintf("state is larger than the state server's limit of %d bytes (--state-server-max-state-bytes): split the Stack or ask the operator to raise the limit", tooBig.limit), http.StatusRequestEntityTooLarge)
	case errors.As(err, &tooBig):
		w.Header().Set("Connection", "close")
		http.Error(w, tooBig.Error(), http.StatusRequestEntityTooLarge)
	case errors.Is(err, errBodyTimeout):
		w.Header().Set("Connection", "close")
		http.Error(w, err.Error()+" (--state-server-body-timeout, then at least 1 MiB/s)", http.StatusRequestTimeout)
	case errors.Is(err, errInvalidLockInfo):
		http.Error(w, err.Error(), http.StatusBadRequest)
	case errors.Is(err, errBodyRead):
		w.Header().Set("Connection", "close")
		http.Error(w, errBodyRead.Error(), http.StatusBadRequest)
	case errors.As(err, &locked) && locked.Holder != nil:
		// tofu reads the holder's lock info from the body of a 423.
		writeLocked(w, id, locked.Holder)
	case errors.As(err, &locked):
		http.Error(w, locked.Error(), http.StatusConflict)
	case errors.As(err, &conflict):
		http.Error(w, conflict.Error(), http.StatusConflict)
	case errors.Is(err, state.ErrMigrated):
		http.Error(w, err.Error(), http.StatusConflict)
	case errors.Is(err, state.ErrInvalidState):
		http.Error(w, err.Error(), http.StatusBadRequest)
	case errors.Is(err, errBusy):
		// A body may be left unread: the connection goes.
		w.Header().Set("Connection", "close")
		w.Header().Set("Retry-After", retryAfterSeconds)
		http.Error(w, err.Error()+"; retry later", http.StatusServiceUnavailable)
	case r.Context().Err() != nil:
		http.Error(w, "request cancelled", http.StatusServiceUnavailable)
	default:
		h.Log.Error(err, "state request failed", "method", r.Method, "state", key.String())
		http.Error(w, "internal error while handling the state; see the controller's log", http.StatusInternalServerError)
	}
}
