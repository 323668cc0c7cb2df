// Package launcher runs one runner pod per run: it issues the run's
// certificate, creates the pod and its TLS Secret in the Stack's namespace,
// dials the runner over mutual TLS as soon as its container runs (the
// health check over mutual TLS is the readiness test, so no probe period
// is waited for) and notices within seconds when it dies. One informer on
// runner pods serves every run.
//
// The pod spec is the same on every cluster: the runner binds $(POD_IP),
// paths are flags under its volume mounts, and it has no probe: a runner
// pod is Ready once its container runs, and /readyz on its health port
// says whether it serves.
package launcher

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"math/big"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/runner"
	"github.com/terrace-dev/terrace/internal/runphase"
)

// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;create;delete;patch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;create;delete;patch

// Defaults of Options.
const (
	DefaultGRPCPort     = int32(9090)
	DefaultHealthPort   = int32(9091)
	DefaultStartTimeout = 5 * time.Minute

	// cleanupTimeout bounds removing what a failed Start created.
	cleanupTimeout = 30 * time.Second
)

// ErrInvalidSpec wraps errors of a RunSpec that can never make a pod: the
// user must change the Stack or its config (a terminal error).
var ErrInvalidSpec = errors.New("invalid runner spec")

// ErrPolicyViolation wraps the runnerpolicy.Violations of a RunSpec the
// runner policy refuses: nothing was created (a terminal error).
var ErrPolicyViolation = errors.New("runner policy violation")

// ErrClosed is a Run's cause once Close was called.
var ErrClosed = errors.New("run closed")

// Options configure a Launcher.
type Options struct {
	// Client talks to the API server: create, watch and delete pods and
	// Secrets (uncached). Required.
	Client kubernetes.Interface
	// Authority issues each run's leaf and is the trust for runners. Required.
	Authority *pki.Authority
	// ControllerCertificate is presented to runners; by default a
	// controller leaf issued (and renewed) by Authority.
	ControllerCertificate pki.CertificateSource
	// DefaultImage is the runner image when RunSpec.Image is empty.
	DefaultImage string
	// GRPCPort and HealthPort are the runner's ports; 9090 and 9091 by default.
	GRPCPort, HealthPort int32
	// StartTimeout bounds creating the pod until the runner answers over
	// mutual TLS (image pulls included); 5 minutes by default.
	StartTimeout time.Duration
	// Namespaces, when set, are the only namespaces whose runner pods are
	// watched (the controller's --watch-namespaces): one watch per
	// namespace, none cluster-wide. Empty watches every namespace.
	Namespaces []string
	// Shard is the controller shard's ID, labelled on its runner pods
	// (LabelShard): a shard adopts only its own warm pods, and a Stack moved
	// mid-run waits for the other shard's run (OtherShardRuns). Empty: none.
	Shard string
}

// Launcher starts runner pods. It is safe for concurrent use.
type Launcher struct {
	opts       Options
	controller pki.CertificateSource

	pods *podWatch

	mu     sync.Mutex
	active map[string]bool // namespace/stack-label/runID of runs started and not closed
}

// New checks opts and returns a Launcher.
func New(opts Options) (*Launcher, error) {
	if opts.Client == nil || opts.Authority == nil {
		return nil, errors.New("a launcher needs a Kubernetes client and the controller's Authority")
	}
	if opts.GRPCPort == 0 {
		opts.GRPCPort = DefaultGRPCPort
	}
	if opts.HealthPort == 0 {
		opts.HealthPort = DefaultHealthPort
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = DefaultStartTimeout
	}
	cert := opts.ControllerCertificate
	if cert == nil {
		cert = pki.NewIssuedCertificate(opts.Authority, pki.LeafRequest{
			Identity: pki.ControllerIdentity,
			Validity: opts.Authority.Options().MaxLeafValidity,
		})
	}
	return &Launcher{opts: opts, controller: cert, pods: newPodWatch(opts.Client, opts.Namespaces), active: map[string]bool{}}, nil
}

// Stop ends the launcher's watch on runner pods; runs still open no longer
// learn that their pod died. Call it when the launcher is no longer used.
func (l *Launcher) Stop() { l.pods.stop() }

// NewRunID returns a random run ID of 8 lowercase letters and digits.
func NewRunID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 8)
	for i := range b {
		n, err := rand.Int(rand.Reader, big.NewInt(int64(len(alphabet))))
		if err != nil {
			panic("launcher: no randomness: " + err.Error())
		}
		b[i] = alphabet[n.Int64()]
	}
	return string(b)
}

func activeKey(namespace, stack, runID string) string {
	return namespace + "/" + StackLabelValue(stack) + "/" + runID
}

func (l *Launcher) setActive(key string, on bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if on && l.active[key] {
		return false
	}
	if on {
		l.active[key] = true
	} else {
		delete(l.active, key)
	}
	return true
}

func (l *Launcher) isActive(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.active[key]
}

// runTimeout resolves RunSpec.Timeout.
func runTimeout(ctx context.Context, spec *RunSpec) time.Duration {
	if spec.Timeout > 0 {
		return spec.Timeout
	}
	if d, ok := ctx.Deadline(); ok {
		if left := time.Until(d); left > 0 {
			return left
		}
	}
	if t := spec.Stack.Spec.Timeout; t != nil && t.Duration > 0 {
		return t.Duration
	}
	return DefaultRunTimeout
}

// Start creates the run's TLS Secret and runner pod, waits until the runner
// is ready and answers over mutual TLS with the run's identity, and returns
// the connected Run. ctx bounds the start and is the parent of
// Run.Context(). On failure nothing is left behind (unless Retain).
//
// The Secret is created right after the pod, owned by it, so it goes with
// the pod (createPodAndSecret).
func (l *Launcher) Start(ctx context.Context, spec RunSpec) (*Run, error) {
	p, err := l.plan(ctx, spec)
	if err != nil {
		return nil, err
	}
	// The shared watch must be in sync before the pod exists, so it sees
	// every change of the pod, its deletion included (one List, once).
	if err := l.pods.synced(ctx); err != nil {
		return nil, err
	}
	stack := spec.Stack
	key := activeKey(stack.Namespace, stack.Name, spec.RunID)
	if !l.setActive(key, true) {
		return nil, fmt.Errorf("run %s of Stack %s/%s is already started", spec.RunID, stack.Namespace, stack.Name)
	}
	started := time.Now()
	podName := p.podName
	identity := pki.RunnerIdentity(stack.Namespace, stack.Name, spec.RunID)
	if spec.ReadOnly {
		identity = pki.ReadOnlyRunnerIdentity(stack.Namespace, stack.Name, spec.RunID)
	}
	log := ctrl.LoggerFrom(ctx).WithValues("runID", spec.RunID, "pod", types.NamespacedName{Namespace: stack.Namespace, Name: podName}.String())

	validity := min(p.deadline+10*time.Minute, l.opts.Authority.Options().MaxLeafValidity)
	secret := buildSecret(p.secretName, p, nil, runLabels(stack.Name, spec.RunID, ComponentRunnerTLS))
	pod, err := l.createPodAndSecret(ctx, buildPod(p), secret, p, pki.LeafRequest{Identity: identity, Validity: validity})
	if err != nil {
		l.setActive(key, false)
		return nil, err
	}
	log.V(1).Info("runner pod created")

	run := newRun(l, spec, key, pod, secret.Name, identity, ctx)
	if err := run.start(ctx, started); err != nil {
		cleanupCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_ = run.Close(cleanupCtx)
		return nil, err
	}
	log.Info("runner ready", "podIP", run.PodIP(), "startDuration", run.StartDuration().Round(time.Millisecond).String())
	if spec.Timings != nil {
		spec.Timings.Add(runphase.Pod, run.StartDuration())
	}
	return run, nil
}

// plan checks spec and resolves everything the pod is built from.
func (l *Launcher) plan(ctx context.Context, spec RunSpec) (podParams, error) {
	if err := validateRunSpec(&spec); err != nil {
		return podParams{}, err
	}
	image := spec.Image
	if image == "" {
		image = l.opts.DefaultImage
	}
	if image == "" {
		return podParams{}, fmt.Errorf("%w: no runner image configured", ErrInvalidSpec)
	}
	if err := checkPolicy(&spec, image); err != nil {
		return podParams{}, err
	}
	podName := PodName(spec.Stack.Name, spec.RunID)
	return podParams{
		spec:         spec,
		image:        image,
		grpcPort:     l.opts.GRPCPort,
		healthPort:   l.opts.HealthPort,
		deadline:     runTimeout(ctx, &spec) + l.opts.StartTimeout + terminationGrace,
		secretName:   secretName(podName),
		stackOwner:   stackOwnerRef(spec.Stack),
		podName:      podName,
		runnerLabels: l.withShard(runLabels(spec.Stack.Name, spec.RunID, ComponentRunner)),
	}, nil
}

// explainCreateError adds what to do to the API errors a user causes.
func explainCreateError(err error, p podParams) error {
	msg := err.Error()
	// The ServiceAccount admission plugin refuses a pod whose account does
	// not exist with "error looking up service account ns/name"; an RBAC
	// denial also names a "system:serviceaccount:" user and must not be
	// mistaken for it.
	if apierrors.IsForbidden(err) && strings.Contains(msg, "error looking up service account") {
		sa := p.spec.ServiceAccountName
		if sa == "" {
			sa = "default"
		}
		return fmt.Errorf("create ServiceAccount %q in namespace %q or name an existing one (spec.serviceAccountName): %w", sa, p.spec.Stack.Namespace, err)
	}
	if apierrors.IsInvalid(err) {
		return fmt.Errorf("%w: %w", ErrInvalidSpec, err)
	}
	return err
}

// createPodAndSecret creates the run's pod and then its TLS Secret, owned
// by the pod from the start: it goes with the pod (garbage collection),
// with no patch to hand it over and no delete of its own. The kubelet
// retries mounting a Secret volume that does not exist yet, and
// the Secret follows the pod within a round trip, normally before the pod
// is even bound to a node. The Secret holds a leaf issued for leaf once
// the pod exists, bound to the pod's UID: a pod created again under its
// name with a copy of the Secret is not the pod the leaf names, for the
// state server or for the launcher dialling it. On failure nothing is
// left behind.
func (l *Launcher) createPodAndSecret(ctx context.Context, pod *corev1.Pod, secret *corev1.Secret, p podParams, leaf pki.LeafRequest) (*corev1.Pod, error) {
	created, err := l.opts.Client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		cleanupCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		// A create whose answer was lost (the caller gave up, a timeout)
		// may still have made the pod: the name is this run's own, so
		// delete it too, unless the name was someone else's.
		if !apierrors.IsAlreadyExists(err) {
			_ = l.deleteObjects(cleanupCtx, pod.Namespace, pod.Name, "", "")
		}
		return nil, fmt.Errorf("failed to create runner pod %s: %w", pod.Name, explainCreateError(err, p))
	}
	leaf.PodUID = string(created.UID)
	issued, err := l.opts.Authority.Issue(leaf)
	if err != nil {
		cleanupCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_ = l.deleteObjects(cleanupCtx, pod.Namespace, created.Name, created.UID, "")
		return nil, fmt.Errorf("failed to issue the certificate of runner pod %s: %w", pod.Name, err)
	}
	secret.Data = issued.SecretData()
	secret.OwnerReferences = []metav1.OwnerReference{{
		APIVersion: "v1", Kind: "Pod", Name: created.Name, UID: created.UID,
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(false),
	}}
	if _, err := l.opts.Client.CoreV1().Secrets(pod.Namespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		cleanupCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_ = l.deleteObjects(cleanupCtx, pod.Namespace, created.Name, created.UID, "")
		return nil, fmt.Errorf("failed to create the runner's TLS Secret %s: %w", secret.Name, err)
	}
	return created, nil
}

// dial connects to the runner at ip with the run's expected identity, in
// the pod with uid: its certificate must be bound to that pod.
func (l *Launcher) dial(ctx context.Context, ip string, identity pki.Identity, uid types.UID, opts ...grpc.DialOption) (*runner.Client, error) {
	addr := net.JoinHostPort(ip, strconv.Itoa(int(l.opts.GRPCPort)))
	return runner.Dial(ctx, addr, pki.ClientTLSConfigForPod(l.controller, l.opts.Authority, identity, string(uid)), opts...)
}
