package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/launcher"
	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/pki/casecret"
)

// readyWarmPod waits for an unclaimed, ready warm pod in the namespace
// other than those in not, held by the controller's pool, and returns it.
func (e *stackEnv) readyWarmPod(t *testing.T, not ...string) corev1.Pod {
	t.Helper()
	var found corev1.Pod
	eventually(t, stackTimeout, "a ready warm runner pod", func() error {
		var pods corev1.PodList
		if err := e.c.List(context.Background(), &pods, client.InNamespace(e.ns), client.HasLabels{launcher.LabelWarmClass}); err != nil {
			return err
		}
	next:
		for _, p := range pods.Items {
			for _, n := range not {
				if p.Name == n {
					continue next
				}
			}
			if p.Labels[launcher.LabelRun] == "" && p.DeletionTimestamp == nil && podReady(&p) {
				found = p
				return nil
			}
		}
		return fmt.Errorf("none among %d warm pods", len(pods.Items))
	})
	waitPoolHolds(t, found)
	return found
}

// waitPoolHolds waits until the controller's warm pool has connected to
// the warm pod: a run reserves only such a pod, and the pod is Ready (what
// readyWarmPod sees) a moment before. A CI run under load created its
// Stack in between, and the run started a pod of its own.
func waitPoolHolds(t *testing.T, warm corev1.Pod) {
	t.Helper()
	pod := fmt.Sprintf("%q", warm.Namespace+"/"+warm.Name)
	eventually(t, time.Minute, "the warm pool to connect to "+warm.Name, func() error {
		for _, line := range strings.Split(controllerLog.String(), "\n") {
			if strings.Contains(line, `"warm runner ready"`) && strings.Contains(line, pod) {
				return nil
			}
		}
		return fmt.Errorf("no 'warm runner ready' line for %s in the controller's log", pod)
	})
}

// credentialsClient is an HTTPS client presenting leaf, trusting its CAs.
func credentialsClient(t *testing.T, leaf *pki.Leaf) stolenRunner {
	t.Helper()
	cert, err := leaf.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(leaf.CABundlePEM)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}
	return stolenRunner{client: &http.Client{Timeout: 30 * time.Second, Transport: tr}}
}

// TestTenancyWarmRunners: with spec.runner.warm a namespace keeps a warm
// runner pod. Its own (class) credentials, taken from its Secret as a
// module could, open no Stack's state and no Program. A run claims it
// (status.currentRun is the warm pod's ID), and the run's identity opens
// its own Stack's state only, only while it runs. A replacement is started,
// and the next run gets another pod: a warm pod is never reused.
func TestTenancyWarmRunners(t *testing.T) {
	e := newStackEnv(t)
	// The provisioner touches <marker>-<name>-<generation> in its working
	// directory, inside the runner's container: the test sees the apply
	// reach it as a process whose command line names the marker.
	marker := "applying-" + e.ns
	e.program(t, "slow", map[string]string{"main.tf": markedSlowModule})
	e.create(t, &terracev1.TerraceConfig{
		ObjectMeta: metav1.ObjectMeta{Name: terracev1.TerraceConfigName},
		Spec:       terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{Warm: ptr.To(int32(1))}},
	})
	stackSpec := func(name, generation, sleep string) terracev1.StackSpec {
		return terracev1.StackSpec{
			Source: terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "slow"}},
			Vars: map[string]apiextensionsv1.JSON{
				"generation": {Raw: []byte(generation)}, "sleep": {Raw: []byte(sleep)},
				"marker": {Raw: []byte(strconv.Quote(marker + "-" + name))},
			},
			ApprovePlan:    terracev1.ApprovePlanAuto,
			DriftDetection: &terracev1.DriftDetection{Mode: terracev1.DriftDetectionDisabled},
		}
	}
	e.create(t, &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Name: "neighbour"}, Spec: stackSpec("neighbour", "1", "0")})
	e.waitStack(t, "neighbour", stackTimeout, "Ready", readyAt)

	// Before its claim: the class identity alone opens nothing.
	warm := e.readyWarmPod(t)
	var secret corev1.Secret
	if err := e.c.Get(context.Background(), types.NamespacedName{Namespace: e.ns, Name: warm.Name + "-tls"}, &secret); err != nil {
		t.Fatal(err)
	}
	classLeaf, err := pki.LeafFromSecretData(secret.Data)
	if err != nil {
		t.Fatal(err)
	}
	class := credentialsClient(t, classLeaf)
	class.runID = warm.Name
	e.assertAllRefused(t, class, "neighbour", "the warm pod's class identity")
	var program terracev1.Program
	if err := e.c.Get(context.Background(), types.NamespacedName{Namespace: e.ns, Name: "slow"}, &program); err != nil {
		t.Fatal(err)
	}
	// The artifact server refuses the handshake of a non-run identity, or answers 403.
	resp, err := class.client.Get(program.Status.Artifact.URL)
	switch {
	case err != nil && !strings.Contains(err.Error(), "bad certificate"):
		t.Fatalf("fetching Program slow with the class identity: %v, want 403 or a refused handshake", err)
	case err == nil:
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("the class identity fetched Program slow: %d, want 403 or a refused handshake", resp.StatusCode)
		}
	}

	// A run claims the warm pod; its run identity opens its own state only.
	e.create(t, &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Name: "victim"}, Spec: stackSpec("victim", "1", "20")})
	eventually(t, stackTimeout, "the victim's run to reach apply", func() error {
		if len(processesMentioning(marker+"-victim-1")) == 0 {
			return fmt.Errorf("no process of the apply yet")
		}
		return nil
	})
	runID := e.getStack(t, "victim").Status.CurrentRun
	if launcher.WarmPodName(runID) != warm.Name {
		t.Fatalf("the victim's run %s did not claim warm pod %s", runID, warm.Name)
	}
	run := credentialsClient(t, e.issueRunLeaf(t, pki.RunnerIdentity(e.ns, "victim", runID), string(warm.UID)))
	run.runID = runID
	// 204: its first run has not written state yet, but may read it.
	if code, body := run.do(t, http.MethodGet, e.stateURL(t, "victim"), nil); code != http.StatusOK && code != http.StatusNoContent {
		t.Fatalf("GET of its own state by the claimed run: %d %s, want 200 or 204", code, body)
	}
	e.assertAllRefused(t, run, "neighbour", "the claimed run, another Stack")
	e.waitStack(t, "victim", stackTimeout, "Ready", readyAt)
	waitGone(t, time.Minute, "the claimed warm pod", func() error {
		return e.c.Get(context.Background(), types.NamespacedName{Namespace: e.ns, Name: warm.Name}, &corev1.Pod{})
	})
	e.assertAllRefused(t, run, "victim", "the claimed run after it ended")

	// The next run claims the replacement, never the same pod.
	next := e.readyWarmPod(t, warm.Name)
	e.updateStack(t, "victim", func(s *terracev1.Stack) { s.Spec = stackSpec("victim", "2", "0") })
	st := e.waitStack(t, "victim", stackTimeout, "Ready after the second run", func(s *terracev1.Stack) error {
		if s.Status.LastRun == runID {
			return fmt.Errorf("still at run %s", runID)
		}
		return readyAt(s)
	})
	if launcher.WarmPodName(st.Status.LastRun) != next.Name {
		t.Errorf("the second run %s did not claim the replacement warm pod %s", st.Status.LastRun, next.Name)
	}
}

// issueRunLeaf issues, from the controller's CA, the credentials a claim
// hands a warm runner for the run id, bound to the claimed pod (the runner
// holds them only in memory).
func (e *stackEnv) issueRunLeaf(t *testing.T, id pki.Identity, podUID string) *pki.Leaf {
	t.Helper()
	ca := &casecret.Store{Client: e.c, Key: types.NamespacedName{Namespace: operatorNamespace, Name: "terrace-ca"}}
	authority, err := ca.LoadOrCreate(context.Background(), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := authority.Issue(pki.LeafRequest{Identity: id, Validity: time.Hour, PodUID: podUID})
	if err != nil {
		t.Fatal(err)
	}
	return leaf
}
