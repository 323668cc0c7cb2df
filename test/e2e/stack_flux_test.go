package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/artifact"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/devcluster"
)

// fluxGroup is Flux's source API group; no Flux runs here, so the tests
// install minimal CRDs for its kinds and play source-controller by writing
// status.artifact themselves.
const (
	fluxGroup      = "source.toolkit.fluxcd.io"
	fluxAPIVersion = fluxGroup + "/v1"
)

// fluxPlurals are the resource names of the Flux source kinds a Stack may name.
var fluxPlurals = map[string]string{
	"GitRepository": "gitrepositories",
	"OCIRepository": "ocirepositories",
	"Bucket":        "buckets",
}

// Deadlines for the Stack to notice a change of its Flux source. While a
// source is missing or has no artifact the controller looks again every
// 30 s (sourceWait); a Stack that is Ready should react the way it reacts
// to a Program change, in seconds, not at its next interval (10 m). Both
// leave room for a run on a loaded CI machine on top of that.
const (
	sourcePollDeadline   = 90 * time.Second
	sourceChangeDeadline = 60 * time.Second
)

// fluxSourceCRD is the smallest CRD under which the API server stores a
// Flux source kind with its status subresource.
func fluxSourceCRD(kind string) *apiextensionsv1.CustomResourceDefinition {
	plural := fluxPlurals[kind]
	open := &apiextensionsv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: ptr.To(true)}
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: plural + "." + fluxGroup},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: fluxGroup,
			Names: apiextensionsv1.CustomResourceDefinitionNames{
				Kind: kind, ListKind: kind + "List", Plural: plural, Singular: strings.ToLower(kind),
			},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: "v1", Served: true, Storage: true,
				Subresources: &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}},
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type:       "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{"spec": *open, "status": *open},
				}},
			}},
		},
	}
}

func (e *stackEnv) crdClient(t testing.TB) apiextensionsclient.Interface {
	t.Helper()
	cs, err := apiextensionsclient.NewForConfig(e.dev.Cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// installFluxCRD installs (or finds) the CRD of a Flux source kind; the
// cluster is shared by the package's tests, so it is left in place.
func (e *stackEnv) installFluxCRD(t testing.TB, kind string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := devcluster.InstallCRDs(ctx, e.crdClient(t), []*apiextensionsv1.CustomResourceDefinition{fluxSourceCRD(kind)}); err != nil {
		t.Fatal(err)
	}
}

// fluxArtifact is the part of a Flux source's status.artifact a Stack reads.
type fluxArtifact struct {
	URL, Digest, Revision string
}

// artifactHost serves module tarballs over HTTP, as source-controller
// serves its artifacts, on the node's link. All tests share one server
// (sharedArtifactServer): its address is the one host:port the tests'
// controller lets runners download Flux artifacts from, so a server of the
// same host on another port is another host. Each test's files are under
// a prefix of its own.
type artifactHost struct {
	// url is the server's URL with the test's prefix.
	url   string
	files *artifactFiles
	// prefix is the test's part of the server's paths.
	prefix string
}

type artifactFiles struct {
	mu    sync.Mutex
	files map[string][]byte
}

// sharedArtifactServer is the tests' source-controller stand-in, started
// before the controller (which is told its address).
var sharedArtifactServer = struct {
	once  sync.Once
	url   string
	files *artifactFiles
}{files: &artifactFiles{files: map[string][]byte{}}}

// fluxArtifactAddress starts the shared artifact server on first use and
// returns its host:port.
func fluxArtifactAddress(t testing.TB) string {
	t.Helper()
	sharedArtifactServer.once.Do(func() {
		f := sharedArtifactServer.files
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			f.mu.Lock()
			data, ok := f.files[r.URL.Path]
			f.mu.Unlock()
			if !ok {
				http.NotFound(w, r)
				return
			}
			_, _ = w.Write(data)
		}))
		_ = srv.Listener.Close()
		// Not linkListener: this server outlives the test that starts it.
		l, err := net.Listen("tcp", net.JoinHostPort(sharedDev(t).Node.HostIP(), "0"))
		if err != nil {
			t.Fatal(err)
		}
		srv.Listener = l
		srv.Start()
		sharedArtifactServer.url = srv.URL
	})
	return strings.TrimPrefix(sharedArtifactServer.url, "http://")
}

func newArtifactHost(t testing.TB) *artifactHost {
	t.Helper()
	fluxArtifactAddress(t)
	prefix := "/" + strings.NewReplacer("/", "-", " ", "-").Replace(t.Name())
	h := &artifactHost{url: sharedArtifactServer.url + prefix, files: sharedArtifactServer.files, prefix: prefix}
	t.Cleanup(func() {
		h.files.mu.Lock()
		defer h.files.mu.Unlock()
		for path := range h.files.files {
			if strings.HasPrefix(path, prefix+"/") {
				delete(h.files.files, path)
			}
		}
	})
	return h
}

// serve makes data the file at path (below the test's prefix).
func (h *artifactHost) serve(path string, data []byte) {
	h.files.mu.Lock()
	defer h.files.mu.Unlock()
	h.files.files[h.prefix+path] = data
}

// publish serves a module whose output "release" is release, and returns
// the artifact a source-controller would advertise for it: revision is
// "<ref>@<digest-like id>" as Flux writes it.
func (h *artifactHost) publish(t testing.TB, kind, release string) fluxArtifact {
	t.Helper()
	module := fmt.Sprintf(`
resource "terraform_data" "release" { input = %q }
output "release" { value = terraform_data.release.output }
`, release)
	data, digest, err := artifact.Build(map[string][]byte{"deploy/main.tf": []byte(module)})
	if err != nil {
		t.Fatal(err)
	}
	path := fmt.Sprintf("/%s/%s.tar.gz", strings.ToLower(kind), release)
	h.serve(path, data)
	hexDigest := strings.TrimPrefix(digest, "sha256:")
	revision := "main@sha1:" + hexDigest[:40]
	if kind != "GitRepository" {
		revision = "latest@" + digest
	}
	return fluxArtifact{URL: h.url + path, Digest: digest, Revision: revision}
}

// createFluxSource creates a Flux source object, with status.artifact when
// a is not nil.
func (e *stackEnv) createFluxSource(t testing.TB, kind, name string, a *fluxArtifact) {
	t.Helper()
	src := &unstructured.Unstructured{}
	src.SetAPIVersion(fluxAPIVersion)
	src.SetKind(kind)
	src.SetName(name)
	src.SetNamespace(e.ns)
	src.Object["spec"] = map[string]any{"interval": "1m", "url": "https://git.example.com/infra.git"}
	// The client's REST mapper learns a kind installed a moment ago on its
	// next discovery refresh; until then a create is "no matches for kind".
	eventually(t, 30*time.Second, fmt.Sprintf("%s %s created", kind, name), func() error {
		err := e.c.Create(context.Background(), src)
		if err != nil && !meta.IsNoMatchError(err) {
			t.Fatalf("failed to create %s %s: %v", kind, name, err)
		}
		return err
	})
	if a != nil {
		e.setArtifact(t, kind, name, *a)
	}
}

// setArtifact writes status.artifact through the status subresource, as
// source-controller does after fetching a new revision.
func (e *stackEnv) setArtifact(t testing.TB, kind, name string, a fluxArtifact) {
	t.Helper()
	eventually(t, 30*time.Second, fmt.Sprintf("status.artifact of %s %s", kind, name), func() error {
		src := &unstructured.Unstructured{}
		src.SetAPIVersion(fluxAPIVersion)
		src.SetKind(kind)
		if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: name}, src); err != nil {
			return err
		}
		src.Object["status"] = map[string]any{
			"artifact": map[string]any{
				"url": a.URL, "digest": a.Digest, "revision": a.Revision,
				"path":           fmt.Sprintf("%s/%s/%s/artifact.tar.gz", strings.ToLower(kind), e.ns, name),
				"lastUpdateTime": time.Now().UTC().Format(time.RFC3339),
			},
		}
		return e.c.Status().Update(context.Background(), src)
	})
}

// fluxStack deploys deploy/ of a Flux source and writes its outputs to
// the Secret "<name>-outputs".
func fluxStack(name, kind, source string) *terracev1.Stack {
	return &terracev1.Stack{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: terracev1.StackSpec{
			Source:               terracev1.StackSource{SourceRef: &terracev1.SourceReference{Kind: kind, Name: source}},
			Path:                 "deploy",
			ApprovePlan:          terracev1.ApprovePlanAuto,
			WriteOutputsToSecret: &terracev1.OutputsSecret{Name: name + "-outputs"},
		},
	}
}

// appliedRelease accepts a Stack Ready at want's revision whose outputs
// Secret holds release.
func (e *stackEnv) appliedRelease(want fluxArtifact, release string) func(*terracev1.Stack) error {
	return func(s *terracev1.Stack) error {
		if err := readyAt(s); err != nil {
			return err
		}
		if s.Status.LastAppliedRevision != want.Revision {
			return fmt.Errorf("lastAppliedRevision is %q, want %q", s.Status.LastAppliedRevision, want.Revision)
		}
		var sec corev1.Secret
		if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: s.Name + "-outputs"}, &sec); err != nil {
			return err
		}
		if got := string(sec.Data["release"]); got != release {
			return fmt.Errorf("output release is %q, want %q", got, release)
		}
		return nil
	}
}

// waitingOn accepts a Stack that waits (Ready=False, Reconciling, not
// Stalled) with reason and a message containing text.
func waitingOn(reason, text string) func(*terracev1.Stack) error {
	return func(s *terracev1.Stack) error {
		if err := conditionIs(terracev1.ReadyCondition, metav1.ConditionFalse, reason)(s); err != nil {
			return err
		}
		if outcome.IsTrue(s, terracev1.StalledCondition) {
			return fmt.Errorf("Stalled, want waiting")
		}
		if msg := outcome.Get(s, terracev1.ReadyCondition).Message; !strings.Contains(msg, text) {
			return fmt.Errorf("Ready message %q does not contain %q", msg, text)
		}
		return nil
	}
}

// TestStackFromFluxSources deploys the artifacts of a GitRepository and an
// OCIRepository, and reports a missing source, one without an artifact and
// one whose digest does not match.
func TestStackFromFluxSources(t *testing.T) {
	e := newStackEnv(t)
	e.installFluxCRD(t, "GitRepository")
	e.installFluxCRD(t, "OCIRepository")
	host := newArtifactHost(t)

	git := host.publish(t, "GitRepository", "one")
	e.createFluxSource(t, "GitRepository", "infra", &git)
	e.create(t, fluxStack("from-git", "GitRepository", "infra"))

	oci := host.publish(t, "OCIRepository", "oci-one")
	e.createFluxSource(t, "OCIRepository", "infra-oci", &oci)
	e.create(t, fluxStack("from-oci", "OCIRepository", "infra-oci"))

	e.create(t, fluxStack("missing", "GitRepository", "absent"))
	e.createFluxSource(t, "GitRepository", "not-fetched", nil)
	e.create(t, fluxStack("no-artifact", "GitRepository", "not-fetched"))

	wrong := git
	wrong.Digest = "sha256:" + strings.Repeat("0", 64)
	e.createFluxSource(t, "GitRepository", "tampered", &wrong)
	e.create(t, fluxStack("wrong-digest", "GitRepository", "tampered"))

	e.waitStack(t, "missing", sourcePollDeadline, "waiting for the missing source",
		waitingOn("SourceNotFound", "GitRepository "+e.ns+"/absent"))
	e.waitStack(t, "no-artifact", sourcePollDeadline, "waiting for an artifact",
		waitingOn("SourceNotReady", "GitRepository "+e.ns+"/not-fetched has no artifact"))
	e.waitStack(t, "from-git", stackTimeout, "applied the GitRepository's artifact", e.appliedRelease(git, "one"))
	e.waitStack(t, "from-oci", stackTimeout, "applied the OCIRepository's artifact", e.appliedRelease(oci, "oci-one"))
	e.waitStack(t, "wrong-digest", stackTimeout, "Stalled on the digest", func(s *terracev1.Stack) error {
		if err := conditionIs(terracev1.StalledCondition, metav1.ConditionTrue, "SourceDigestMismatch")(s); err != nil {
			return err
		}
		// The message names the source and the digest it advertises, never
		// the digest of what was served.
		msg := outcome.Get(s, terracev1.ReadyCondition).Message
		if !strings.Contains(msg, "GitRepository "+e.ns+"/tampered") || !strings.Contains(msg, wrong.Digest) {
			return fmt.Errorf("message names neither the source nor its digest: %s", msg)
		}
		if strings.Contains(msg, strings.TrimPrefix(git.Digest, "sha256:")) {
			return fmt.Errorf("message shows the digest of the content served: %s", msg)
		}
		return nil
	})
}

// TestStackFollowsFluxSource: a Stack waiting for its source's first
// artifact deploys it when it arrives, and a Ready Stack deploys each new
// revision its source advertises.
func TestStackFollowsFluxSource(t *testing.T) {
	e := newStackEnv(t)
	e.installFluxCRD(t, "GitRepository")
	host := newArtifactHost(t)

	t.Run("first artifact", func(t *testing.T) {
		t.Parallel()
		e.createFluxSource(t, "GitRepository", "first", nil)
		e.create(t, fluxStack("first", "GitRepository", "first"))
		e.waitStack(t, "first", sourcePollDeadline, "waiting for an artifact", waitingOn("SourceNotReady", "has no artifact"))
		one := host.publish(t, "GitRepository", "first-one")
		e.setArtifact(t, "GitRepository", "first", one)
		e.waitStack(t, "first", sourcePollDeadline, "applied the first artifact", e.appliedRelease(one, "first-one"))
	})

	t.Run("new revision", func(t *testing.T) {
		t.Parallel()
		one := host.publish(t, "GitRepository", "next-one")
		e.createFluxSource(t, "GitRepository", "next", &one)
		e.create(t, fluxStack("next", "GitRepository", "next"))
		e.waitStack(t, "next", stackTimeout, "applied revision one", e.appliedRelease(one, "next-one"))

		two := host.publish(t, "GitRepository", "next-two")
		e.setArtifact(t, "GitRepository", "next", two)
		if err := e.pollStack("next", sourceChangeDeadline, e.appliedRelease(two, "next-two")); err != nil {
			t.Errorf("the Stack did not deploy its GitRepository's new revision within %s: %v", sourceChangeDeadline, err)
			// What a user has to do when the Stack does not notice: ask.
			e.updateStack(t, "next", func(s *terracev1.Stack) {
				s.Annotations = map[string]string{terracev1.ReconcileRequestAnnotation: time.Now().Format(time.RFC3339Nano)}
			})
		}
		st := e.waitStack(t, "next", stackTimeout, "applied revision two", e.appliedRelease(two, "next-two"))
		if st.Status.LastAttemptedRevision != two.Revision {
			t.Errorf("lastAttemptedRevision = %q, want %q", st.Status.LastAttemptedRevision, two.Revision)
		}
	})
}

// TestStackFluxSourceInstalledLater: a Stack naming a Flux kind the cluster
// does not serve yet waits, and deploys once Flux (here: the CRD) is
// installed and the source has an artifact.
func TestStackFluxSourceInstalledLater(t *testing.T) {
	e := newStackEnv(t)
	crds := e.crdClient(t).ApiextensionsV1().CustomResourceDefinitions()
	name := fluxPlurals["Bucket"] + "." + fluxGroup
	removeCRD := func() {
		err := crds.Delete(context.Background(), name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		waitGone(t, 30*time.Second, "CRD "+name+" removed", func() error {
			_, err := crds.Get(context.Background(), name, metav1.GetOptions{})
			return err
		})
	}
	// This test needs a cluster without the kind; it leaves none behind.
	removeCRD()
	t.Cleanup(removeCRD)

	e.create(t, fluxStack("late", "Bucket", "infra"))
	e.waitStack(t, "late", sourcePollDeadline, "waiting for the Bucket kind", waitingOn("SourceNotFound", "Bucket "+e.ns+"/infra"))

	e.installFluxCRD(t, "Bucket")
	a := newArtifactHost(t).publish(t, "Bucket", "late-one")
	e.createFluxSource(t, "Bucket", "infra", &a)
	e.waitStack(t, "late", sourcePollDeadline, "applied the Bucket's artifact", e.appliedRelease(a, "late-one"))
}

// pollStack is waitStack that returns the failure instead of ending the
// test, for a step whose failure the test reports and then works around.
func (e *stackEnv) pollStack(name string, timeout time.Duration, check func(*terracev1.Stack) error) error {
	deadline := time.Now().Add(timeout)
	ticker := time.NewTicker(200 * time.Millisecond)
	defer ticker.Stop()
	for {
		var s terracev1.Stack
		err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: name}, &s)
		if err == nil {
			if err = check(&s); err == nil {
				return nil
			}
			err = fmt.Errorf("%w; conditions: %s", err, conditionsText(&s))
		}
		if time.Now().After(deadline) {
			return err
		}
		<-ticker.C
	}
}
