package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/artifact/artifactserver"
	"github.com/terrace-dev/terrace/internal/devcluster"
	"github.com/terrace-dev/terrace/internal/operator"
	"github.com/terrace-dev/terrace/internal/scheme"
	"github.com/terrace-dev/terrace/internal/testenv"
)

// deployment is what config/default installs, rendered the way
// `kubectl apply -k config/default` renders it.
type deployment struct {
	objects    []*unstructured.Unstructured
	controller *appsv1.Deployment
	service    *corev1.Service
}

// renderDefault runs `kubectl kustomize config/default` with the kubectl of
// the tools cache and decodes its objects.
func renderDefault(t *testing.T) *deployment {
	t.Helper()
	tools, err := testenv.FindTools()
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(filepath.Join(tools.KubebuilderAssets, "kubectl"), "kustomize", filepath.Join(testenv.RepoRoot(), "config", "default"))
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("kubectl kustomize config/default failed: %v\n%s", err, stderr.String())
	}
	d := &deployment{}
	dec := utilyaml.NewYAMLOrJSONDecoder(&stdout, 4096)
	for {
		var raw map[string]any
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatalf("failed to decode the rendered config/default: %v", err)
		}
		if len(raw) > 0 {
			d.objects = append(d.objects, &unstructured.Unstructured{Object: raw})
		}
	}
	for _, o := range d.objects {
		switch o.GetKind() {
		case "Deployment":
			d.controller = typed[appsv1.Deployment](t, d.controller, o)
		case "Service":
			d.service = typed[corev1.Service](t, d.service, o)
		}
	}
	if d.controller == nil || d.service == nil {
		t.Fatalf("config/default must hold one Deployment and one Service; it holds %s", kinds(d.objects))
	}
	return d
}

// typed converts o, failing when a previous object of the kind was found.
func typed[T any](t *testing.T, previous *T, o *unstructured.Unstructured) *T {
	t.Helper()
	if previous != nil {
		t.Fatalf("config/default holds more than one %s", o.GetKind())
	}
	out := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, out); err != nil {
		t.Fatalf("failed to read %s %s: %v", o.GetKind(), o.GetName(), err)
	}
	return out
}

func kinds(objs []*unstructured.Unstructured) string {
	var out []string
	for _, o := range objs {
		out = append(out, o.GetKind()+" "+o.GetName())
	}
	return strings.Join(out, ", ")
}

// controllerContainer returns the container running `terrace controller`.
func (d *deployment) controllerContainer(t *testing.T) *corev1.Container {
	t.Helper()
	for i, c := range d.controller.Spec.Template.Spec.Containers {
		if len(c.Args) > 0 && c.Args[0] == "controller" {
			return &d.controller.Spec.Template.Spec.Containers[i]
		}
	}
	t.Fatalf("no container of Deployment %s runs `terrace controller`", d.controller.Name)
	return nil
}

// controllerOptions parses the container's arguments with the controller's
// own flags and defaults, as the process in the pod would: POD_NAMESPACE
// comes from the downward API, $(VAR) references are expanded.
func (d *deployment) controllerOptions(t *testing.T) operator.Options {
	t.Helper()
	c := d.controllerContainer(t)
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace":
			env[e.Name] = d.controller.Namespace
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		}
	}
	t.Setenv("POD_NAMESPACE", env["POD_NAMESPACE"])
	opts := operator.DefaultOptions()
	fs := pflag.NewFlagSet("controller", pflag.ContinueOnError)
	opts.BindFlags(fs)
	var args []string
	for _, a := range c.Args[1:] {
		for name, value := range env {
			a = strings.ReplaceAll(a, "$("+name+")", value)
		}
		args = append(args, a)
	}
	if err := fs.Parse(args); err != nil {
		t.Fatalf("the Deployment's arguments are not the controller's flags: %v", err)
	}
	return opts
}

// containerPort resolves a Service target port or probe port against the
// controller container.
func (d *deployment) containerPort(t *testing.T, port intstr.IntOrString) int32 {
	t.Helper()
	if port.Type == intstr.Int {
		return port.IntVal
	}
	for _, p := range d.controllerContainer(t).Ports {
		if p.Name == port.StrVal {
			return p.ContainerPort
		}
	}
	t.Fatalf("the controller container has no port named %q", port.StrVal)
	return 0
}

func portOf(t *testing.T, hostPort string) int32 {
	t.Helper()
	_, p, err := net.SplitHostPort(hostPort)
	if err != nil {
		t.Fatalf("failed to read the port of %q: %v", hostPort, err)
	}
	n, err := strconv.ParseInt(p, 10, 32)
	if err != nil {
		t.Fatalf("failed to read the port of %q: %v", hostPort, err)
	}
	return int32(n)
}

// TestManifestServiceMatchesTheAdvertisedServers checks that runner pods can
// reach the servers at the URLs the controller advertises by default: the
// Service has that name, exposes those ports, forwards them to the ports the
// servers listen on, and the serving certificate names it.
func TestManifestServiceMatchesTheAdvertisedServers(t *testing.T) {
	d := renderDefault(t)
	opts := d.controllerOptions(t)
	if opts.Namespace != d.controller.Namespace {
		t.Errorf("the controller's --namespace is %q, its Deployment is in %q", opts.Namespace, d.controller.Namespace)
	}
	if !opts.LeaderElection {
		t.Error("the Deployment runs more than one replica without leader election")
	}

	artifactURL, err := opts.Artifact.AdvertisedBaseURL(opts.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	advertised, err := url.Parse(artifactURL)
	if err != nil {
		t.Fatal(err)
	}
	serviceHost := d.service.Name + "." + d.service.Namespace + ".svc"
	if advertised.Hostname() != serviceHost {
		t.Errorf("the controller advertises the artifact server at %s, the Service is %s", artifactURL, serviceHost)
	}
	if !slices.Contains(opts.ServingDNSNames(), serviceHost) {
		t.Errorf("the serving certificate names %v, not the Service %s", opts.ServingDNSNames(), serviceHost)
	}
	// With no --state-server-advertised-url the state server is advertised
	// at the same Service (artifactserver.DefaultServiceName) with its listen port.
	if opts.State.AdvertisedURL != "" {
		t.Errorf("the Deployment sets --state-server-advertised-url=%s; runners should use the Service default", opts.State.AdvertisedURL)
	}
	if d.service.Name != artifactserver.DefaultServiceName {
		t.Errorf("the Service is %s; the controller advertises the state server at %s", d.service.Name, artifactserver.DefaultServiceName)
	}

	servers := []struct {
		name       string
		advertised int32
		listens    int32
	}{
		{"artifact", portOf(t, advertised.Host), portOf(t, opts.Artifact.ListenAddress)},
		{"state", portOf(t, opts.State.ListenAddress), portOf(t, opts.State.ListenAddress)},
	}
	for _, s := range servers {
		var found *corev1.ServicePort
		for i, p := range d.service.Spec.Ports {
			if p.Port == s.advertised {
				found = &d.service.Spec.Ports[i]
			}
		}
		if found == nil {
			t.Errorf("the %s server is advertised on port %d; the Service exposes %v", s.name, s.advertised, d.service.Spec.Ports)
			continue
		}
		if target := d.containerPort(t, found.TargetPort); target != s.listens {
			t.Errorf("Service port %d (%s) forwards to %d; the %s server listens on %d", found.Port, found.Name, target, s.name, s.listens)
		}
	}

	podLabels := d.controller.Spec.Template.Labels
	for k, v := range d.service.Spec.Selector {
		if podLabels[k] != v {
			t.Errorf("the Service selects %s=%s; the controller pods are labelled %v", k, v, podLabels)
		}
	}
	c := d.controllerContainer(t)
	health := portOf(t, opts.HealthAddr)
	for name, probe := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if probe == nil || probe.HTTPGet == nil {
			t.Errorf("the controller has no HTTP %s probe", name)
			continue
		}
		if port := d.containerPort(t, probe.HTTPGet.Port); port != health {
			t.Errorf("the %s probe calls port %d; /healthz and /readyz are on %d", name, port, health)
		}
	}
}

// TestManifestRBACRunsAStack installs config/default on a dev cluster of its
// own and runs the controller in the test process under the Deployment's
// ServiceAccount (impersonated): with leader election, its CA Secret, and a
// Stack planned and applied by a real runner. A right missing from the
// generated roles shows as a forbidden error and a Stack that never gets
// Ready. The cluster is its own because the package's shared controller
// reconciles every namespace and would race this one for the Stack.
func TestManifestRBACRunsAStack(t *testing.T) {
	// A dev cluster of its own: runs beside the others like it, after
	// the tests of the shared cluster (ownClusterTest).
	ownClusterTest(t)
	d := renderDefault(t)
	ns := d.controller.Namespace
	if ns != operatorNamespace {
		// installOperatorConfig puts the runner's TerraceConfig there.
		t.Fatalf("the Deployment is in %s; the tests configure runners in %s", ns, operatorNamespace)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	dev := startOwnDev(ctx, t, "deploy-rbac")
	admin := dev.Cluster.Config

	// Everything but the Deployment for real (it would run a second
	// controller); the Deployment, and a pod from its template under the
	// namespace's restricted Pod Security level, as dry runs.
	var install []devcluster.Applied
	for _, o := range d.objects {
		if o.GetKind() != "Deployment" {
			install = append(install, devcluster.Applied{Object: o.DeepCopy(), Source: "config/default"})
		}
	}
	if err := devcluster.Apply(ctx, admin, install, func(string) {}); err != nil {
		t.Fatalf("failed to apply config/default: %v", err)
	}
	dryRunCreate(ctx, t, admin, d)

	cs, err := kubernetes.NewForConfig(admin)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(admin, client.Options{Scheme: scheme.New()})
	if err != nil {
		t.Fatal(err)
	}
	env := &stackEnv{dev: dev, cs: cs, c: c}
	env.installOperatorConfig(t)
	env.ns = testNamespace(t, cs)

	user := serviceAccountUser(ctx, t, admin, d)
	asController := rest.CopyConfig(admin)
	asController.Impersonate = rest.ImpersonationConfig{UserName: user}
	assertIdentity(ctx, t, asController, user)

	// Reflector errors (a list or watch refused) go to klog, not to the
	// controller-runtime logger: collect both for the failure message.
	klog.SetLogger(funcr.New(func(prefix, args string) { fmt.Fprintln(controllerLog, prefix, args) }, funcr.Options{}))
	t.Cleanup(klog.ClearLogger)
	logStart := len(controllerLog.String())
	// Only RBAC denials of this controller's user count: the package's
	// shared controller logs to the same place, and a namespace being
	// deleted refuses new objects with "forbidden" too.
	forbiddenLines := func() []string {
		var lines []string
		for _, l := range strings.Split(controllerLog.String()[logStart:], "\n") {
			if strings.Contains(strings.ToLower(l), "forbidden") && strings.Contains(l, user) {
				lines = append(lines, l)
			}
		}
		return lines
	}
	forbidden := func() string {
		lines := forbiddenLines()
		if len(lines) == 0 {
			return "(no controller log line mentions forbidden)"
		}
		return "controller log lines mentioning forbidden:\n" + lastLines(strings.Join(lines, "\n"), 6)
	}

	ports := hostPorts(t, dev, 2)
	opts := operator.LocalOptions(ns, ports[0], ports[1])
	opts.LeaderElection = true
	mgr, err := operator.NewManager(asController, opts)
	if err != nil {
		t.Fatalf("failed to create the controller under %s: %v\n%s", user, err, forbidden())
	}
	mgrCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mgrCtx) }()
	t.Cleanup(func() {
		stop()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("the controller stopped with an error: %v", err)
			}
		case <-time.After(2 * time.Minute):
			t.Error("the controller did not stop within 2 minutes")
		}
	})
	// waitFor polls cond until the deadline. It fails at once when the
	// controller exits or is refused anything: with the right roles it
	// never is, and a refusal only repeats until the deadline.
	waitFor := func(timeout time.Duration, what string, cond func() error) {
		t.Helper()
		eventually(t, timeout, what, func() error {
			select {
			case err := <-done:
				done <- err
				t.Fatalf("the controller exited while waiting for %s: %v\n%s", what, err, forbidden())
			default:
			}
			if len(forbiddenLines()) > 0 {
				t.Fatalf("the controller was refused something while waiting for %s; the generated roles lack a right.\n%s", what, forbidden())
			}
			return cond()
		})
	}

	waitFor(time.Minute, "the controller to hold the leader Lease", func() error {
		lease, err := cs.CoordinationV1().Leases(ns).Get(ctx, "terrace-controller-leader", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
			return errors.New("the Lease has no holder")
		}
		return nil
	})

	env.program(t, "data", map[string]string{"main.tf": `
variable "greeting" { type = string }
resource "terraform_data" "note" { input = var.greeting }
output "note" { value = terraform_data.note.output }
`})
	env.create(t, &terracev1.Stack{
		ObjectMeta: metav1.ObjectMeta{Name: "data"},
		Spec: terracev1.StackSpec{
			Source:        terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "data"}},
			Vars:          jsonVars(t, map[string]any{"greeting": "hello"}),
			ApprovePlan:   terracev1.ApprovePlanAuto,
			RetryInterval: &metav1.Duration{Duration: 2 * time.Second},
		},
	})
	var last terracev1.Stack
	waitFor(stackTimeout, "Stack data to be Ready under the controller's own RBAC", func() error {
		if err := c.Get(ctx, client.ObjectKey{Namespace: env.ns, Name: "data"}, &last); err != nil {
			return err
		}
		if err := readyAt(&last); err != nil {
			return fmt.Errorf("%w; conditions: %s", err, conditionsText(&last))
		}
		return nil
	})
	if last.Status.Release == nil || last.Status.Release.Revision != 1 {
		t.Errorf("the Stack is Ready without release 1: %+v", last.Status.Release)
	}

	// Events go out in the background and a refused one is only logged by
	// client-go: check they arrived, in the Stack's namespace (ClusterRole)
	// and, for leader election, in the controller's (Role).
	waitFor(30*time.Second, "an event about Stack data", func() error {
		var events eventsv1.EventList
		if err := c.List(ctx, &events, client.InNamespace(env.ns)); err != nil {
			return err
		}
		for _, ev := range events.Items {
			if ev.Regarding.Kind == "Stack" && ev.Regarding.Name == "data" {
				return nil
			}
		}
		return fmt.Errorf("no event regards the Stack among %d", len(events.Items))
	})
	waitFor(30*time.Second, "the leader-election event in "+ns, func() error {
		events, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, ev := range events.Items {
			if ev.InvolvedObject.Kind == "Lease" && ev.Reason == "LeaderElection" {
				return nil
			}
		}
		return fmt.Errorf("no LeaderElection event among %d", len(events.Items))
	})
	runAPIServerUnderControllerRBAC(t, c, env.ns, waitFor)
	if len(forbiddenLines()) > 0 {
		t.Errorf("the Stack got Ready, but the controller was refused something:\n%s", forbidden())
	}
}

// dryRunCreate has the API server validate and admit the Deployment, and a
// pod of its template (the namespace enforces the restricted Pod Security
// level), without running them.
func dryRunCreate(ctx context.Context, t *testing.T, cfg *rest.Config, d *deployment) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range d.objects {
		if o.GetKind() != "Deployment" {
			continue
		}
		gvr := appsv1.SchemeGroupVersion.WithResource("deployments")
		if _, err := dyn.Resource(gvr).Namespace(o.GetNamespace()).Create(ctx, o.DeepCopy(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
			t.Fatalf("the API server refuses Deployment %s: %v", o.GetName(), err)
		}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: d.controller.Name + "-dry-run", Namespace: d.controller.Namespace, Labels: d.controller.Spec.Template.Labels},
		Spec:       d.controller.Spec.Template.Spec,
	}
	podObj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(pod)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: podObj}
	u.SetGroupVersionKind(schema.GroupVersionKind{Version: "v1", Kind: "Pod"})
	if _, err := dyn.Resource(corev1.SchemeGroupVersion.WithResource("pods")).Namespace(pod.Namespace).Create(ctx, u, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Fatalf("the API server refuses a pod of the controller's template in %s: %v", pod.Namespace, err)
	}
}

// serviceAccountUser returns the user name of the Deployment's
// ServiceAccount, after checking the manifests bind both generated roles
// to it.
func serviceAccountUser(ctx context.Context, t *testing.T, cfg *rest.Config, d *deployment) string {
	t.Helper()
	sa := d.controller.Spec.Template.Spec.ServiceAccountName
	if sa == "" {
		t.Fatal("the Deployment runs under the default ServiceAccount")
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ServiceAccounts(d.controller.Namespace).Get(ctx, sa, metav1.GetOptions{}); err != nil {
		t.Fatalf("the Deployment's ServiceAccount was not installed: %v", err)
	}
	subject := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: d.controller.Namespace}
	bound := map[string]bool{}
	for _, o := range d.objects {
		if o.GetKind() != "ClusterRoleBinding" && o.GetKind() != "RoleBinding" {
			continue
		}
		var b rbacv1.RoleBinding // a ClusterRoleBinding has the same fields
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &b); err != nil {
			t.Fatal(err)
		}
		if slices.Contains(b.Subjects, subject) {
			bound[b.RoleRef.Kind] = true
		}
	}
	if !bound["ClusterRole"] || !bound["Role"] {
		t.Fatalf("ServiceAccount %s must be bound to the generated ClusterRole and Role; bound: %v", sa, bound)
	}
	return "system:serviceaccount:" + d.controller.Namespace + ":" + sa
}

// assertIdentity checks that the API server sees cfg as the ServiceAccount
// and nothing more: the test would prove nothing as an administrator.
func assertIdentity(ctx context.Context, t *testing.T, cfg *rest.Config, user string) {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	review, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("failed to review the impersonated identity: %v", err)
	}
	got := review.Status.UserInfo
	if got.Username != user || slices.Contains(got.Groups, "system:masters") {
		t.Fatalf("the controller's client acts as %s %v, want %s without system:masters", got.Username, got.Groups, user)
	}
}

// TestDeployRunsTheControllerFromTheImage installs config/default, as
// rendered and unchanged, on a dev cluster whose registry serves the image
// built from this checkout under the tags the manifests name: the
// Deployment's two replicas run from that image on the real node with
// leader election, and a Stack goes Ready through them, its runner pod
// running from the same image and reaching the controller through its
// Service. No controller runs in the test process.
func TestDeployRunsTheControllerFromTheImage(t *testing.T) {
	d := renderDefault(t)
	runControllerFromImage(t, d.objects, d.controller)
}

// runControllerFromImage installs objects (a rendering of config/default or
// of the Helm chart, whose controller Deployment is controller) unchanged on
// a dev cluster of its own that serves the image under the tags they name,
// waits for two controller pods running from that image with one leader,
// and applies a Stack through them whose runner pods run from the same
// image.
func runControllerFromImage(t *testing.T, objects []*unstructured.Unstructured, controller *appsv1.Deployment) {
	t.Helper()
	ns := controller.Namespace
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	rendered, err := json.Marshal(objects)
	if err != nil {
		t.Fatal(err)
	}
	tags := devcluster.ManifestImageTags(rendered)
	if len(tags) != 1 {
		t.Fatalf("the manifests name the Terrace image with tags %v, want one", tags)
	}
	dev := startOwnDev(ctx, t, "deploy-image", tags...)
	image := devcluster.PublishedRegistry + "/" + devcluster.ImageRepository + ":" + tags[0]
	admin := dev.Cluster.Config
	cs := kubernetes.NewForConfigOrDie(admin)
	c, err := client.New(admin, client.Options{Scheme: scheme.New()})
	if err != nil {
		t.Fatal(err)
	}
	pushed, err := remoteDigest(dev.Registry.Host + "/" + devcluster.ImageRepository + ":" + tags[0])
	if err != nil {
		t.Fatal(err)
	}

	var install []devcluster.Applied
	for _, o := range objects {
		install = append(install, devcluster.Applied{Object: o.DeepCopy(), Source: "the rendered manifests"})
	}
	env := &stackEnv{dev: dev, cs: cs, c: c}
	env.installOperatorConfig(t)
	if err := devcluster.Apply(ctx, admin, install, func(string) {}); err != nil {
		t.Fatalf("failed to apply the rendered manifests: %v", err)
	}

	selector := metav1.FormatLabelSelector(controller.Spec.Selector)
	// The pod's image is ghcr.io/terrace-dev/terrace:<tag>, pulled from the
	// dev registry; its id names the digest.
	wantImageID := image[:strings.LastIndex(image, ":")] + "@" + pushed
	var podNames []string
	eventually(t, 3*time.Minute, "two controller pods Ready from the registry image", func() error {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return err
		}
		podNames = nil
		var states []string
		for _, p := range pods.Items {
			if len(p.Status.ContainerStatuses) != 1 {
				states = append(states, p.Name+": "+string(p.Status.Phase))
				continue
			}
			st := p.Status.ContainerStatuses[0]
			states = append(states, podState(ctx, cs, &p, st))
			if w := st.State.Waiting; w != nil && (w.Reason == "ErrImagePull" || w.Reason == "ImagePullBackOff") {
				t.Fatalf("pod %s cannot pull %s: %s", p.Name, st.Image, w.Message)
			}
			if st.Ready && st.State.Running != nil {
				if st.ImageID != wantImageID {
					t.Fatalf("pod %s runs image %s, want %s", p.Name, st.ImageID, wantImageID)
				}
				podNames = append(podNames, p.Name)
			}
		}
		if len(podNames) != 2 {
			return fmt.Errorf("ready controller pods: %v of %d:\n%s", podNames, len(pods.Items), strings.Join(states, "\n"))
		}
		return nil
	})
	// The Lease's holder is <hostname>_<uuid>, the pod's name: the leader is
	// that pod, and the only one whose reconcilers started (they run only
	// on the elected leader).
	eventually(t, time.Minute, "one controller pod to hold the leader Lease", func() error {
		lease, err := cs.CoordinationV1().Leases(ns).Get(ctx, "terrace-controller-leader", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
			return errors.New("the Lease has no holder")
		}
		var leaders []string
		var last string
		for _, p := range podNames {
			logs, err := podLogs(ctx, cs, ns, p, &corev1.PodLogOptions{})
			if err != nil {
				return err
			}
			if strings.Contains(logs, `"msg":"Starting workers"`) {
				leaders = append(leaders, p)
			}
			last = lastLines(logs, 5)
		}
		if len(leaders) != 1 {
			return fmt.Errorf("pods running reconcilers (the Lease is held by %s): %v; the last pod's log ends:\n%s", *lease.Spec.HolderIdentity, leaders, last)
		}
		return nil
	})
	env.ns = testNamespace(t, cs)
	runnerImages := watchImageIDs(ctx, t, cs, env.ns)
	env.program(t, "data", map[string]string{"main.tf": `
resource "terraform_data" "note" { input = "from the image" }
output "note" { value = terraform_data.note.output }
`})
	env.create(t, &terracev1.Stack{
		ObjectMeta: metav1.ObjectMeta{Name: "data"},
		Spec: terracev1.StackSpec{
			Source:        terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "data"}},
			ApprovePlan:   terracev1.ApprovePlanAuto,
			RetryInterval: &metav1.Duration{Duration: 2 * time.Second},
		},
	})
	var last terracev1.Stack
	eventually(t, stackTimeout, "Stack data to be Ready through the controller pods", func() error {
		if err := c.Get(ctx, client.ObjectKey{Namespace: env.ns, Name: "data"}, &last); err != nil {
			return err
		}
		if err := readyAt(&last); err != nil {
			return fmt.Errorf("%w; conditions: %s", err, conditionsText(&last))
		}
		return nil
	})
	if ids := runnerImages(); len(ids) == 0 || !slices.ContainsFunc(ids, func(id string) bool { return strings.HasSuffix(id, "@"+pushed) }) {
		t.Errorf("runner pods ran images %v, want the pushed %s", ids, pushed)
	}
}

// remoteDigest returns the digest the registry serves for ref.
func remoteDigest(ref string) (string, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return "", err
	}
	desc, err := remote.Head(r)
	if err != nil {
		return "", err
	}
	return desc.Digest.String(), nil
}

// watchImageIDs records the image ids of the pods that run in ns until ctx
// ends; the returned function lists those seen so far.
func watchImageIDs(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns string) func() []string {
	t.Helper()
	w, err := cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	var mu sync.Mutex
	seen := map[string]bool{}
	go func() {
		for ev := range w.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok {
				mu.Lock()
				for _, st := range p.Status.ContainerStatuses {
					if st.State.Running != nil || st.State.Terminated != nil {
						seen[st.ImageID] = true
					}
				}
				mu.Unlock()
			}
		}
	}()
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		var out []string
		for id := range seen {
			out = append(out, id)
		}
		return out
	}
}

// podState describes a controller pod for a failure message: its state and
// the last lines of its log.
func podState(ctx context.Context, cs kubernetes.Interface, p *corev1.Pod, st corev1.ContainerStatus) string {
	state := fmt.Sprintf("%s: ready=%v restarts=%d", p.Name, st.Ready, st.RestartCount)
	if w := st.State.Waiting; w != nil {
		state += " waiting " + w.Reason + ": " + w.Message
	}
	if st.State.Running != nil {
		state += " running"
	}
	logs, err := podLogs(ctx, cs, p.Namespace, p.Name, &corev1.PodLogOptions{TailLines: ptr.To[int64](8)})
	if err == nil && logs != "" {
		state += "\n    " + strings.ReplaceAll(strings.TrimSpace(logs), "\n", "\n    ")
	}
	return state
}
