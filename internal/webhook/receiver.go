// Package webhook receives the forges' push and pull-request webhooks and
// asks for a reconcile of the Stacks they concern, so that a push is
// planned within seconds instead of at the Stack's interval.
//
// A request is trusted only once a Stack's own webhook secret verifies it:
// GitHub's and Gitea's (or Forgejo's) HMAC-SHA256 of the body, GitLab's
// X-Gitlab-Token. Until then nothing is written and every refusal reads the
// same, whether no Stack names the repository or the signature is wrong.
package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/forge"
)

// Path is the receiver's route; {namespace} is the Stacks' namespace.
const Path = "/hooks/{namespace}"

// SecretKey is the key of the webhook Secret that holds the secret.
const SecretKey = "token"

// Options bound what the receiver accepts.
type Options struct {
	// MaxBodyBytes of a payload; 1 MiB when zero. GitHub caps payloads
	// at 25 MB, but a push that concerns Stacks is far smaller.
	MaxBodyBytes int64
	// NamespaceRate and NamespaceBurst limit the requests for one
	// namespace; 2/s with bursts of 20 when zero.
	NamespaceRate  rate.Limit
	NamespaceBurst int
	// Rate and Burst limit all requests; 20/s with bursts of 100 when zero.
	Rate  rate.Limit
	Burst int
	// Timeout of handling one request (reads and patches); 10s when zero.
	Timeout time.Duration
}

func (o Options) withDefaults() Options {
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = 1 << 20
	}
	if o.NamespaceRate <= 0 {
		o.NamespaceRate = 2
	}
	if o.NamespaceBurst <= 0 {
		o.NamespaceBurst = 20
	}
	if o.Rate <= 0 {
		o.Rate = 20
	}
	if o.Burst <= 0 {
		o.Burst = 100
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	return o
}

// maxTrackedNamespaces bounds the per-namespace limiters kept: the
// namespace is the caller's to choose, so past this many the map starts
// over (the overall limit still holds).
const maxTrackedNamespaces = 4096

// Receiver is the webhook endpoint.
type Receiver struct {
	reader client.Reader
	writer client.Writer
	opts   Options
	log    logr.Logger

	overall    *rate.Limiter
	mu         sync.Mutex
	namespaces map[string]*rate.Limiter
}

// +kubebuilder:rbac:groups=terrace.dev,resources=stacks,verbs=get;list;watch;patch

// New returns a receiver that reads Stacks and Secrets with reader (the
// manager's client: Stacks from its cache, Secrets as the manager reads
// them) and writes the reconcile request with writer.
func New(reader client.Reader, writer client.Writer, opts Options) *Receiver {
	opts = opts.withDefaults()
	return &Receiver{
		reader: reader, writer: writer, opts: opts,
		log:        ctrllog.Log.WithName("webhook"),
		overall:    rate.NewLimiter(opts.Rate, opts.Burst),
		namespaces: map[string]*rate.Limiter{},
	}
}

// Register adds the receiver to mux at POST /hooks/{namespace}.
func (r *Receiver) Register(mux *http.ServeMux) {
	mux.Handle("POST "+Path, r)
}

// Answers. One refusal for every request no Stack verifies.
const refused = "the webhook's signature matches no Stack of this namespace that names the repository: check the URL, the namespace and the webhook secret"

type accepted struct {
	Stacks int `json:"stacks"`
}

func (r *Receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	ns := req.PathValue("namespace")
	if len(validation.IsDNS1123Label(ns)) > 0 {
		http.Error(w, "not a namespace", http.StatusNotFound)
		return
	}
	// The namespace's limit first: a flood at one namespace does not
	// spend the others' share of the overall limit.
	if !r.namespaceLimiter(ns).Allow() || !r.overall.Allow() {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "too many webhook requests", http.StatusTooManyRequests)
		return
	}
	d, err := readDelivery(req.Header)
	switch {
	case errors.Is(err, errUnsigned):
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	case err != nil:
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	kind := kindOf(d)
	if kind == "" {
		http.Error(w, errUnknownKind.Error(), http.StatusBadRequest)
		return
	}
	body, err := r.readBody(w, req)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			http.Error(w, fmt.Sprintf("the payload is larger than %d bytes", r.opts.MaxBodyBytes), http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "failed to read the payload", http.StatusBadRequest)
		return
	}
	ev, err := parseEvent(d, kind, payloadOf(req, body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if ev.kind == "" {
		// A comment on an issue, not on a pull request: nothing to do.
		writeAccepted(w, 0)
		return
	}
	ctx, cancel := context.WithTimeout(req.Context(), r.opts.Timeout)
	defer cancel()
	log := r.log.WithValues("namespace", ns, "forge", d.forge, "event", d.event)
	stacks, err := r.verifiedStacks(ctx, log, ns, d, ev, body)
	if err != nil {
		log.Error(err, "failed to list the namespace's Stacks")
		http.Error(w, "failed to read Stacks", http.StatusServiceUnavailable)
		return
	}
	if len(stacks) == 0 {
		http.Error(w, refused, http.StatusUnauthorized)
		return
	}
	n, err := r.requestReconciles(ctx, stacks, ev)
	if err != nil && n == 0 {
		log.Error(err, "failed to request a reconcile")
		http.Error(w, "failed to request a reconcile", http.StatusServiceUnavailable)
		return
	}
	log.V(1).Info("webhook accepted", "kind", ev.kind, "ref", ev.ref, "number", ev.number, "stacks", n)
	writeAccepted(w, n)
}

func writeAccepted(w http.ResponseWriter, n int) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	json.NewEncoder(w).Encode(accepted{Stacks: n})
}

func (r *Receiver) namespaceLimiter(ns string) *rate.Limiter {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.namespaces[ns]
	if l == nil {
		if len(r.namespaces) >= maxTrackedNamespaces {
			r.namespaces = map[string]*rate.Limiter{}
		}
		l = rate.NewLimiter(r.opts.NamespaceRate, r.opts.NamespaceBurst)
		r.namespaces[ns] = l
	}
	return l
}

func (r *Receiver) readBody(w http.ResponseWriter, req *http.Request) ([]byte, error) {
	if req.ContentLength > r.opts.MaxBodyBytes {
		return nil, &http.MaxBytesError{Limit: r.opts.MaxBodyBytes}
	}
	return io.ReadAll(http.MaxBytesReader(w, req.Body, r.opts.MaxBodyBytes))
}

// payloadOf is the JSON of a payload GitHub or Gitea sent form-encoded
// (payload=...); the signature is of the body as sent.
func payloadOf(req *http.Request, body []byte) []byte {
	mt, _, _ := mime.ParseMediaType(req.Header.Get("Content-Type"))
	if mt != "application/x-www-form-urlencoded" {
		return body
	}
	form, err := url.ParseQuery(string(body))
	if err != nil {
		return nil
	}
	return []byte(form.Get("payload"))
}

// verifiedStacks are the namespace's Stacks whose Git source names the
// event's repository and whose webhook secret verifies the delivery.
func (r *Receiver) verifiedStacks(ctx context.Context, log logr.Logger, ns string, d delivery, ev event, body []byte) ([]terracev1.Stack, error) {
	keys := map[string]bool{}
	for _, u := range ev.repoURLs {
		if repo, err := forge.ParseRepository(u); err == nil {
			keys[repo.Key()] = true
		}
	}
	var list terracev1.StackList
	if err := r.reader.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	verdicts := map[string]bool{} // by Secret name: read and checked once
	var out []terracev1.Stack
	for _, s := range list.Items {
		git := s.Spec.Source.Git
		if git == nil || git.Webhook == nil || git.Webhook.SecretRef.Name == "" {
			continue
		}
		repo, err := forge.ParseRepository(git.URL)
		if err != nil || !keys[repo.Key()] {
			continue
		}
		name := git.Webhook.SecretRef.Name
		ok, seen := verdicts[name]
		if !seen {
			ok = r.verifyWith(ctx, log, ns, name, d, body)
			verdicts[name] = ok
		}
		if ok {
			out = append(out, s)
		}
	}
	return out, nil
}

func (r *Receiver) verifyWith(ctx context.Context, log logr.Logger, ns, name string, d delivery, body []byte) bool {
	var secret corev1.Secret
	if err := r.reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &secret); err != nil {
		if !apierrors.IsNotFound(err) {
			log.Error(err, "failed to read a webhook Secret", "secret", name)
		}
		return false
	}
	return d.verify(body, []byte(strings.TrimSpace(string(secret.Data[SecretKey]))))
}

// concerns reports whether an event is news for a Stack: a push to the
// branch it follows (or of a tag, for a tag or semver ref), or a pull
// request into that branch when it plans pull requests.
func concerns(s *terracev1.Stack, ev event) bool {
	git := s.Spec.Source.Git
	ref := terracev1.GitRef{}
	if git.Ref != nil {
		ref = *git.Ref
	}
	branch := ref.Branch
	if branch == "" && ref.Tag == "" && ref.SemVer == "" && ref.Commit == "" {
		branch = "main"
	}
	switch ev.kind {
	case kindPing:
		return false
	case kindPush:
		if b, ok := strings.CutPrefix(ev.ref, "refs/heads/"); ok {
			return branch != "" && b == branch && ref.Commit == ""
		}
		return strings.HasPrefix(ev.ref, "refs/tags/") && (ref.Tag != "" || ref.SemVer != "")
	case kindPullRequest, kindComment:
		if git.PullRequests == nil || !git.PullRequests.Enabled {
			return false
		}
		return ev.base == "" || branch == "" || ev.base == branch
	}
	return false
}

// requestReconciles sets terrace.dev/requestedAt on the Stacks the event
// concerns, by a merge patch of that annotation alone.
func (r *Receiver) requestReconciles(ctx context.Context, stacks []terracev1.Stack, ev event) (int, error) {
	value := time.Now().UTC().Format(time.RFC3339Nano)
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{terracev1.ReconcileRequestAnnotation: value}}})
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for i := range stacks {
		s := &stacks[i]
		if !concerns(s, ev) {
			continue
		}
		if err := r.writer.Patch(ctx, s, client.RawPatch(types.MergePatchType, patch)); err != nil {
			if !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("failed to annotate Stack %s/%s: %w", s.Namespace, s.Name, err))
			}
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}
