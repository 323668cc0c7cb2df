package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/launcher"
	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/httpbackend"
	"github.com/terrace-dev/terrace/internal/state/storetest"
)

// stolenRunner is a runner's credentials taken from its TLS Secret while
// the run was live, as a module that reads its own pod's files, or whoever
// reads the Secret, could.
type stolenRunner struct {
	runID  string
	client *http.Client
}

func (e *stackEnv) stealRunnerCredentials(t *testing.T, stack string) stolenRunner {
	t.Helper()
	var secrets corev1.SecretList
	if err := e.c.List(context.Background(), &secrets, client.InNamespace(e.ns), client.MatchingLabels{
		launcher.LabelComponent: launcher.ComponentRunnerTLS, launcher.LabelStack: launcher.StackLabelValue(stack),
	}); err != nil {
		t.Fatal(err)
	}
	if len(secrets.Items) != 1 {
		t.Fatalf("want one runner TLS Secret of a live run of %s, found %d", stack, len(secrets.Items))
	}
	leaf, err := pki.LeafFromSecretData(secrets.Items[0].Data)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := leaf.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(leaf.CABundlePEM)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}
	return stolenRunner{runID: secrets.Items[0].Labels[launcher.LabelRun], client: &http.Client{Timeout: 30 * time.Second, Transport: tr}}
}

func (s stolenRunner) do(t *testing.T, method, url string, body []byte) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, data
}

func (e *stackEnv) stateURL(t *testing.T, stack string) string {
	t.Helper()
	stackCtl.mu.Lock()
	defer stackCtl.mu.Unlock()
	return httpbackend.Address(stackCtl.ctrl.stateURL, state.Key{Namespace: e.ns, Stack: stack, Workspace: "default"})
}

// assertAllRefused makes every request a runner can and wants 403 for each,
// with the state's serial and lineage and its lock unchanged.
func (e *stackEnv) assertAllRefused(t *testing.T, thief stolenRunner, stack, when string) {
	t.Helper()
	before, lockBefore := e.stateOf(t, stack)
	url := e.stateURL(t, stack)
	lock := []byte(`{"ID":"thief","Operation":"OperationTypeApply","Who":"thief"}`)
	for _, a := range []struct {
		method string
		url    string
		body   []byte
	}{
		{http.MethodGet, url, nil},
		{http.MethodPost, url, storetest.StateJSON(before.Lineage, before.Serial+10, 0, 100)},
		{httpbackend.MethodLock, url, lock},
		{httpbackend.MethodUnlock, url, lock},
	} {
		code, body := thief.do(t, a.method, a.url, a.body)
		if code != http.StatusForbidden {
			t.Fatalf("%s: %s with run %s's certificate answered %d %s, want 403", when, a.method, thief.runID, code, body)
		}
	}
	after, lockAfter := e.stateOf(t, stack)
	if after.Serial != before.Serial || after.Lineage != before.Lineage || after.Version != before.Version {
		t.Fatalf("%s: state of %s went from serial %d lineage %s to %d %s", when, stack, before.Serial, before.Lineage, after.Serial, after.Lineage)
	}
	if (lockBefore == nil) != (lockAfter == nil) {
		t.Fatalf("%s: lock of %s went from %+v to %+v", when, stack, lockBefore, lockAfter)
	}
}

// TestTenancyRunCredentialsEndWithTheRun is issue 10's item 6 as the
// attack: a runner's certificate and key, taken during its run, are used
// against its own Stack's state after the run ended and after another run
// started (403 for every method, state unchanged), against a neighbour
// Stack's state during the run (403), and to LOCK during the run, whose
// 423 does not tell who holds the lock.
func TestTenancyRunCredentialsEndWithTheRun(t *testing.T) {
	e := newStackEnv(t)
	// The provisioner touches <marker>-<name>-<generation> in its working
	// directory, inside the runner's container: the test sees the apply
	// reach it as a process whose command line names the marker.
	marker := "applying-" + e.ns
	e.program(t, "slow", map[string]string{"main.tf": markedSlowModule})
	for _, name := range []string{"victim", "neighbour"} {
		e.create(t, &terracev1.Stack{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: terracev1.StackSpec{
				Source: terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "slow"}},
				Vars: map[string]apiextensionsv1.JSON{
					"generation": {Raw: []byte("1")},
					"sleep":      {Raw: []byte("0")},
					"marker":     {Raw: []byte(strconv.Quote(marker + "-" + name))},
				},
				ApprovePlan:    terracev1.ApprovePlanAuto,
				DriftDetection: &terracev1.DriftDetection{Mode: terracev1.DriftDetectionDisabled},
			},
		})
	}
	e.waitStack(t, "victim", stackTimeout, "Ready", readyAt)
	e.waitStack(t, "neighbour", stackTimeout, "Ready", readyAt)

	// A second run of the victim that sleeps in apply, holding its lock.
	e.updateStack(t, "victim", func(s *terracev1.Stack) {
		s.Spec.Vars["generation"] = apiextensionsv1.JSON{Raw: []byte("2")}
		s.Spec.Vars["sleep"] = apiextensionsv1.JSON{Raw: []byte("20")} // room for the attempts below on a loaded machine
	})
	eventually(t, stackTimeout, "the victim's second run to reach apply", func() error {
		if len(processesMentioning(marker+"-victim-2")) == 0 {
			return fmt.Errorf("no process of the apply yet")
		}
		return nil
	})
	thief := e.stealRunnerCredentials(t, "victim")
	if cur := e.getStack(t, "victim").Status.CurrentRun; cur != thief.runID {
		t.Fatalf("status.currentRun is %q during run %s", cur, thief.runID)
	}

	// While the run lasts its certificate opens its own state, and only that.
	if code, body := thief.do(t, http.MethodGet, e.stateURL(t, "victim"), nil); code != http.StatusOK {
		t.Fatalf("GET by the live run: %d %s", code, body)
	}
	e.assertAllRefused(t, thief, "neighbour", "another Stack during the run")
	var held *state.LockInfo
	eventually(t, 10*time.Second, "the applying run to hold the lock", func() error {
		if _, held = e.stateOf(t, "victim"); held == nil {
			return fmt.Errorf("no lock held")
		}
		return nil
	})
	code, body := thief.do(t, httpbackend.MethodLock, e.stateURL(t, "victim"), []byte(`{"ID":"thief","Who":"thief"}`))
	if code != http.StatusLocked || bytes.Contains(body, []byte(held.ID)) || bytes.Contains(body, []byte(held.Who)) {
		t.Fatalf("LOCK while the run holds the lock: %d %s; want 423 not naming holder %s (%s)", code, body, held.ID, held.Who)
	}

	// The run ends: once its pod is gone (a terminating runner may still
	// save the state tofu was interrupted in), so is its certificate's access.
	e.waitStack(t, "victim", stackTimeout, "Ready after the second run", readyAt)
	eventually(t, time.Minute, "the second run's pod to be gone", func() error {
		var pods corev1.PodList
		if err := e.c.List(context.Background(), &pods, client.InNamespace(e.ns), client.MatchingLabels{launcher.LabelRun: thief.runID}); err != nil {
			return err
		}
		if len(pods.Items) > 0 {
			return fmt.Errorf("pod %s is still there", pods.Items[0].Name)
		}
		return nil
	})
	e.assertAllRefused(t, thief, "victim", "its own Stack after the run")

	// Another run starts and ends: the old run is a previous run now.
	e.updateStack(t, "victim", func(s *terracev1.Stack) {
		s.Spec.Vars["generation"] = apiextensionsv1.JSON{Raw: []byte("3")}
		s.Spec.Vars["sleep"] = apiextensionsv1.JSON{Raw: []byte("0")}
	})
	st := e.waitStack(t, "victim", stackTimeout, "Ready after the third run", readyAt)
	if st.Status.LastRun == "" || st.Status.LastRun == thief.runID || st.Status.CurrentRun != "" {
		t.Fatalf("status.lastRun after a new run: %q, currentRun %q (stolen run %s); want the new run, and none current once it ended", st.Status.LastRun, st.Status.CurrentRun, thief.runID)
	}
	e.assertAllRefused(t, thief, "victim", "its own Stack after a later run")
}
