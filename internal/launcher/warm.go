package launcher

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/runphase"
)

// LabelWarmClass marks a warm runner pod with its runner class. A warm pod
// has no terrace.dev/stack or terrace.dev/run label until a run claims it.
const LabelWarmClass = "terrace.dev/warm-class"

// warmPodPrefix starts every warm pod's name; the rest is the ID of the run
// that will claim it, so the run's pod is found from its ID alone.
const warmPodPrefix = "terrace-warm-"

// warmLeafValidity bounds a warm pod's class certificate; the pool replaces
// pods well before (MaxWarmAge).
const warmLeafValidity = 12 * time.Hour

// MaxWarmAge is how long a warm pod waits for a run before it is replaced:
// its certificate and the CAs it trusts stay valid for well over that.
const MaxWarmAge = 6 * time.Hour

// errClaimed ends a warm run's own context once a run has claimed its pod.
var errClaimed = errors.New("claimed by a run")

// WarmPodName is the name of the warm pod that the run runID claims.
func WarmPodName(runID string) string { return warmPodPrefix + runID }

// Class names the runner class of spec: the pod a run of it gets, without
// the run. ok is false when the Stack's own spec.runner sets pod template
// bits beyond image, env and resources (volumes, placement, labels): such
// a Stack always gets a pod of its own.
func Class(spec RunSpec) (class string, ok bool) {
	if t := spec.Stack.Spec.Runner; t != nil {
		if len(t.EnvFrom) > 0 || len(t.NodeSelector) > 0 || len(t.Tolerations) > 0 || t.Affinity != nil ||
			len(t.Volumes) > 0 || len(t.VolumeMounts) > 0 || len(t.Labels) > 0 || len(t.Annotations) > 0 {
			return "", false
		}
	}
	if g := spec.Stack.Spec.Source.Git; g != nil && g.SecretRef != nil {
		// The credentials are mounted when the pod is made, for its Stack.
		return "", false
	}
	resources := DefaultResources()
	if spec.Resources != nil {
		resources = *spec.Resources
	}
	binary := spec.Binary
	if binary == "" {
		binary = terracev1.BinaryTofu
	}
	sa := spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	raw, err := json.Marshal(struct {
		Image, Binary, ServiceAccount, ProviderMirror string
		Resources                                     corev1.ResourceRequirements
		Env                                           []corev1.EnvVar
	}{spec.Image, string(binary), sa, spec.ProviderMirror, resources, spec.Env})
	if err != nil {
		return "", false
	}
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:5]), true
}

// WarmSpec is a warm pod to start: the RunSpec a run of its class would
// have, with a Stack that holds only the namespace.
type WarmSpec struct {
	Namespace string
	// RunID names the pod (WarmPodName) and, once claimed, its run; empty
	// picks a new one. The pool picks it, so that it knows the pod by name
	// while it starts.
	RunID string
	// Run is the class's RunSpec; Stack and RunID are ignored.
	Run RunSpec
}

// StartWarm starts a warm runner pod of spec's class and returns it
// connected, once it answers over mutual TLS as its class identity. ctx
// bounds the start only; the pod lives until Claim's run closes it or the
// pool deletes it (DeleteWarm).
func (l *Launcher) StartWarm(ctx context.Context, spec WarmSpec) (*Run, error) {
	run := spec.Run
	run.Stack = &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Namespace: spec.Namespace, Name: "warm", UID: "warm"}}
	run.RunID = spec.RunID
	if run.RunID == "" {
		run.RunID = NewRunID()
	}
	run.Retain, run.Timings = false, nil
	class, ok := Class(run)
	if !ok {
		return nil, fmt.Errorf("%w: a warm pod has no pod template of a Stack", ErrInvalidSpec)
	}
	p, err := l.plan(ctx, run)
	if err != nil {
		return nil, err
	}
	if err := l.pods.synced(ctx); err != nil {
		return nil, err
	}
	started := time.Now()
	p.podName = WarmPodName(run.RunID)
	p.secretName = secretName(p.podName)
	p.runnerLabels = l.withShard(map[string]string{LabelManagedBy: ManagedByTerrace, LabelComponent: ComponentRunner, LabelWarmClass: class})
	identity := pki.RunnerClassIdentity(spec.Namespace, class, p.podName)
	secretLabels := map[string]string{LabelManagedBy: ManagedByTerrace, LabelComponent: ComponentRunnerTLS, LabelWarmClass: class}
	secret := buildSecret(p.secretName, p, nil, secretLabels)
	leaf := pki.LeafRequest{Identity: identity, Validity: min(warmLeafValidity, l.opts.Authority.Options().MaxLeafValidity)}
	pod, err := l.createPodAndSecret(ctx, buildWarmPod(p), secret, p, leaf)
	if err != nil {
		return nil, err
	}
	// The warm run lives beyond ctx: its context ends when the pod does.
	w := newRun(l, run, "", pod, secret.Name, identity, context.Background())
	if err := w.start(ctx, started); err != nil {
		cleanupCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_ = w.Close(cleanupCtx)
		return nil, err
	}
	return w, nil
}

// buildWarmPod is the pod of the class: what a run's pod is, with the
// class's labels, no owner (its namespace and the pool own it until a run
// claims it) and no deadline (set at the claim), running the runner in
// warm mode.
func buildWarmPod(p podParams) *corev1.Pod {
	pod := buildPod(p)
	pod.OwnerReferences = nil
	pod.Spec.ActiveDeadlineSeconds = nil
	c := &pod.Spec.Containers[0]
	c.Args = append(c.Args, "--warm")
	return pod
}

// Claim makes the warm pod w the runner of spec's run: it checks the
// runner policy, issues the run's certificate and gives it to the runner
// over the controller's mutual TLS connection, and meanwhile hands the pod
// the run's labels, owner and deadline. It returns once the runner holds
// the certificate, so the run's module can be sent while the relabel is on
// its way: call the run's Labelled before anything that reaches the state
// server. spec.RunID must be w.ID(). w is consumed: on failure its pod is
// deleted; a warm pod is never used for a second run.
func (l *Launcher) Claim(ctx context.Context, w *Run, spec RunSpec) (*Run, error) {
	started := time.Now()
	if w.Err() != nil {
		// Claimed already, or its pod died: never a second run on it.
		return nil, fmt.Errorf("warm runner pod %s cannot be claimed: %w", w.pod, context.Cause(w.ctx))
	}
	if err := validateRunSpec(&spec); err != nil {
		return nil, l.discardWarm(ctx, w, err)
	}
	if spec.ReadOnly {
		return nil, l.discardWarm(ctx, w, fmt.Errorf("%w: a read-only run cannot claim a warm pod", ErrInvalidSpec))
	}
	if spec.RunID != w.ID() {
		return nil, l.discardWarm(ctx, w, fmt.Errorf("%w: run %s cannot claim warm pod %s", ErrInvalidSpec, spec.RunID, w.pod.Name))
	}
	p, err := l.plan(ctx, spec)
	if err != nil {
		return nil, l.discardWarm(ctx, w, err)
	}
	stack := spec.Stack
	key := activeKey(stack.Namespace, stack.Name, spec.RunID)
	if !l.setActive(key, true) {
		return nil, l.discardWarm(ctx, w, fmt.Errorf("run %s of Stack %s/%s is already started", spec.RunID, stack.Namespace, stack.Name))
	}
	run := newRun(l, spec, key, w.last, w.secret, w.identity, ctx)
	run.client, run.podIP = w.Client(), w.PodIP()
	run.runningOnce.Do(func() { close(run.runningCh) })
	l.pods.replace(w, run)
	if err := l.claimPod(run, p); err != nil {
		cleanupCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_ = run.Close(cleanupCtx)
		return nil, err
	}
	run.mu.Lock()
	run.startDuration = time.Since(started)
	run.mu.Unlock()
	if spec.Timings != nil {
		spec.Timings.Add(runphase.Pod, run.StartDuration())
	}
	ctrl.LoggerFrom(ctx).Info("claimed warm runner", "runID", spec.RunID, "pod", run.pod.String(), "claimDuration", run.StartDuration().Round(time.Millisecond).String())
	return run, nil
}

// claimPod hands the runner the run's certificate while the pod is
// relabelled for the run (the relabel's result is the run's Labelled): the
// two are independent, and a run claims on its critical path. Holding the
// certificate opens nothing before the label is in place (the state server
// accepts a run's certificate only from a pod labelled with the run). When
// the hand-over fails, claimPod waits for the relabel too, so the caller
// deletes a pod no request changes any more, certificate and all.
func (l *Launcher) claimPod(run *Run, p podParams) error {
	pod := run.last
	run.labelled = make(chan struct{})
	go func() {
		defer close(run.labelled)
		run.labelErr = l.relabelForRun(run.ctx, pod, p)
	}()
	if err := l.handOverCertificate(run, p); err != nil {
		<-run.labelled
		return errors.Join(run.labelErr, err)
	}
	return nil
}

// relabelForRun gives a warm pod its run's labels, owner and deadline.
func (l *Launcher) relabelForRun(ctx context.Context, pod *corev1.Pod, p podParams) error {
	stack := p.spec.Stack
	age := time.Duration(0)
	if pod.Status.StartTime != nil {
		age = time.Since(pod.Status.StartTime.Time)
	}
	deadline := int64((age + p.deadline + time.Second - 1) / time.Second)
	owner, err := json.Marshal([]metav1.OwnerReference{p.stackOwner})
	if err != nil {
		return err
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%s:%s,%s:%s},"ownerReferences":%s},"spec":{"activeDeadlineSeconds":%d}}`,
		strconv.Quote(LabelStack), strconv.Quote(StackLabelValue(stack.Name)), strconv.Quote(LabelRun), strconv.Quote(p.spec.RunID), owner, deadline)
	if _, err := l.opts.Client.CoreV1().Pods(stack.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("failed to label warm runner pod %s for run %s: %w", pod.Name, p.spec.RunID, err)
	}
	return nil
}

// handOverCertificate issues the run's certificate, bound to the warm pod
// (the pod the controller dialled and the run's labels go on), and gives
// it to the warm runner over the controller's mutual TLS connection.
func (l *Launcher) handOverCertificate(run *Run, p podParams) error {
	stack := p.spec.Stack
	identity := pki.RunnerIdentity(stack.Namespace, stack.Name, p.spec.RunID)
	validity := min(p.deadline+10*time.Minute, l.opts.Authority.Options().MaxLeafValidity)
	leaf, err := l.opts.Authority.Issue(pki.LeafRequest{Identity: identity, Validity: validity, PodUID: string(run.uid)})
	if err != nil {
		return fmt.Errorf("failed to issue the run's certificate: %w", err)
	}
	got, err := run.Client().Claim(run.ctx, leaf)
	if err != nil {
		return err
	}
	if got != identity {
		return fmt.Errorf("warm runner pod %s claimed as %s, want %s", run.pod.Name, got, identity)
	}
	return nil
}

// discardWarm deletes a warm pod that a run could not claim and returns err.
func (l *Launcher) discardWarm(ctx context.Context, w *Run, err error) error {
	cleanupCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	_ = w.Close(cleanupCtx)
	return err
}

// WarmPods are the cached warm pods of a namespace (every namespace when
// empty) that no run has claimed, for the pool to adopt or remove (no API
// call): this shard's only (LabelShard), each shard keeping a pool of its own.
func (l *Launcher) WarmPods(ctx context.Context, namespace string) ([]*corev1.Pod, error) {
	pods, err := l.pods.namespacePods(ctx, namespace)
	if err != nil {
		return nil, err
	}
	var warm []*corev1.Pod
	for _, pod := range pods {
		if pod.Labels[LabelWarmClass] != "" && pod.Labels[LabelRun] == "" && pod.Labels[LabelShard] == l.opts.Shard {
			warm = append(warm, pod)
		}
	}
	return warm, nil
}

// AdoptWarm connects to a warm pod that a former leader started (its
// runner answers as its class identity, with a certificate bound to this
// very pod's UID) so the pool can hand it out. A pod created again under a
// warm pod's name and labels, with a copy of its TLS Secret, presents a
// certificate of another pod: it is never adopted, and is deleted.
func (l *Launcher) AdoptWarm(ctx context.Context, pod *corev1.Pod) (*Run, error) {
	class := pod.Labels[LabelWarmClass]
	runID, ok := cutWarmPrefix(pod.Name)
	if class == "" || !ok {
		return nil, fmt.Errorf("pod %s/%s is not a warm runner pod", pod.Namespace, pod.Name)
	}
	spec := RunSpec{Stack: &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: "warm", UID: "warm"}}, RunID: runID}
	identity := pki.RunnerClassIdentity(pod.Namespace, class, pod.Name)
	w := newRun(l, spec, "", pod, secretName(pod.Name), identity, context.Background())
	if err := w.start(ctx, time.Now()); err != nil {
		cleanupCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_ = w.Close(cleanupCtx)
		return nil, err
	}
	return w, nil
}

func cutWarmPrefix(name string) (string, bool) {
	if len(name) <= len(warmPodPrefix) || name[:len(warmPodPrefix)] != warmPodPrefix {
		return "", false
	}
	return name[len(warmPodPrefix):], true
}

// DeleteWarm deletes an unclaimed warm pod that the pool does not hold,
// with its TLS Secret.
func (l *Launcher) DeleteWarm(ctx context.Context, pod *corev1.Pod) error {
	if pod.Labels[LabelWarmClass] == "" || pod.Labels[LabelRun] != "" {
		return fmt.Errorf("pod %s/%s is not an unclaimed warm runner pod", pod.Namespace, pod.Name)
	}
	return l.deleteObjects(ctx, pod.Namespace, pod.Name, pod.UID, secretName(pod.Name))
}
