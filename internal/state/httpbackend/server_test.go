package httpbackend_test

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/httpbackend"
	"github.com/terrace-dev/terrace/internal/state/storetest"
)

func lockBody(t *testing.T, info state.LockInfo) []byte {
	raw, err := json.Marshal(info)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func TestProtocol(t *testing.T) {
	f := newFixture(t, httpbackend.Options{MaxStateBytes: 12 << 20})
	ns, stack := uniqueName("ns-"), "app"
	key := state.Key{Namespace: ns, Stack: stack, Workspace: "default"}
	url := httpbackend.Address(f.baseURL, key)
	f.runs.startRun(t, ns, stack, "run-1")
	c := f.client(t, pki.RunnerIdentity(ns, stack, "run-1"))
	ctrl := f.client(t, pki.ControllerIdentity)

	if r := do(t, c, http.MethodGet, url, nil); r.code != http.StatusNoContent {
		t.Fatalf("GET of a missing state: %d %s", r.code, r.body)
	}
	s1 := storetest.StateJSON("lin", 1, 0, 1000)
	if r := do(t, c, http.MethodPost, url, s1); r.code != http.StatusOK {
		t.Fatalf("POST: %d %s", r.code, r.body)
	}
	r := do(t, c, http.MethodGet, url, nil)
	if r.code != http.StatusOK || !bytes.Equal(r.body, s1) {
		t.Fatalf("GET: %d, %d bytes", r.code, len(r.body))
	}
	if r.proto != "HTTP/1.1" {
		t.Fatalf("served over %s, want HTTP/1.1 (HTTP/2 off)", r.proto)
	}

	holder := state.LockInfo{ID: "lock-1", Operation: "OperationTypeApply", Who: "runner@pod", Version: "1.12.6", Created: time.Now().UTC().Truncate(time.Second)}
	if r := do(t, c, httpbackend.MethodLock, url, lockBody(t, holder)); r.code != http.StatusOK {
		t.Fatalf("LOCK: %d %s", r.code, r.body)
	}
	// A runner is told the state is locked, never by whom; the controller is.
	r = do(t, c, httpbackend.MethodLock, url, lockBody(t, state.LockInfo{ID: "lock-2", Who: "other"}))
	var got state.LockInfo
	if r.code != http.StatusLocked || json.Unmarshal(r.body, &got) != nil || got.ID != "held-by-another-run" || bytes.Contains(r.body, []byte(holder.ID)) || bytes.Contains(r.body, []byte(holder.Who)) {
		t.Fatalf("second LOCK by a runner: %d %s, want 423 with a lock info naming nobody", r.code, r.body)
	}
	r = do(t, ctrl, httpbackend.MethodLock, url, lockBody(t, state.LockInfo{ID: "lock-3", Who: "controller"}))
	if r.code != http.StatusLocked || json.Unmarshal(r.body, &got) != nil || got.ID != holder.ID || got.Who != holder.Who || got.Operation != holder.Operation {
		t.Fatalf("LOCK by the controller: %d %s, want 423 with the holder's lock info", r.code, r.body)
	}
	if got.Owner != string(pki.RunnerIdentity(ns, stack, "run-1")) {
		t.Fatalf("the lock's owner is %q, want the runner that took it", got.Owner)
	}
	s2 := storetest.StateJSON("lin", 2, 0, 1000)
	if r := do(t, c, http.MethodPost, url, s2); r.code != http.StatusLocked {
		t.Fatalf("POST without the lock ID on a locked state: %d %s", r.code, r.body)
	}
	if r := do(t, c, http.MethodPost, url+"?ID=lock-2", s2); r.code != http.StatusLocked {
		t.Fatalf("POST with another lock ID: %d %s", r.code, r.body)
	}
	if r := do(t, c, http.MethodPost, url+"?ID=lock-1", s2); r.code != http.StatusOK {
		t.Fatalf("POST with the lock ID: %d %s", r.code, r.body)
	}
	r = do(t, c, http.MethodPost, url+"?ID=lock-1", storetest.StateJSON("lin", 1, 0, 100))
	if r.code != http.StatusConflict || !strings.Contains(string(r.body), "serial 1 is lower than the stored serial 2") {
		t.Fatalf("POST of a lower serial: %d %s", r.code, r.body)
	}
	r = do(t, c, http.MethodPost, url+"?ID=lock-1", storetest.StateJSON("other-lineage", 3, 0, 100))
	if r.code != http.StatusConflict || !strings.Contains(string(r.body), "lineage") {
		t.Fatalf("POST of a foreign lineage: %d %s", r.code, r.body)
	}
	if r := do(t, c, http.MethodPost, url+"?ID=lock-1", []byte("{not json")); r.code != http.StatusBadRequest {
		t.Fatalf("POST of garbage: %d %s", r.code, r.body)
	}
	if r := do(t, c, httpbackend.MethodUnlock, url, lockBody(t, state.LockInfo{ID: "lock-2"})); r.code != http.StatusLocked {
		t.Fatalf("UNLOCK with another ID: %d %s", r.code, r.body)
	}
	if r := do(t, c, httpbackend.MethodUnlock, url, lockBody(t, state.LockInfo{ID: "lock-1"})); r.code != http.StatusOK {
		t.Fatalf("UNLOCK: %d %s", r.code, r.body)
	}
	if r := do(t, c, http.MethodPost, url+"?ID=lock-1", storetest.StateJSON("lin", 3, 0, 100)); r.code != http.StatusConflict {
		t.Fatalf("POST naming a released lock: %d %s", r.code, r.body)
	}
	if r := do(t, c, http.MethodPost, url, storetest.StateJSON("lin", 3, 0, 13<<20)); r.code != http.StatusRequestEntityTooLarge {
		t.Fatalf("POST over the size limit: %d", r.code)
	}
	big := storetest.StateJSON("lin", 4, 0, 10<<20)
	if r := do(t, c, http.MethodPost, url, big); r.code != http.StatusOK {
		t.Fatalf("POST of 10 MiB: %d %s", r.code, r.body)
	}
	if r := do(t, c, http.MethodGet, url, nil); !bytes.Equal(r.body, big) {
		t.Fatalf("GET of 10 MiB returned %d bytes", len(r.body))
	}
	if r := do(t, c, "PATCH", url, nil); r.code != http.StatusMethodNotAllowed {
		t.Fatalf("PATCH: %d", r.code)
	}
	if r := do(t, c, http.MethodDelete, url, nil); r.code != http.StatusForbidden {
		t.Fatalf("DELETE by a runner: %d", r.code)
	}
	if r := do(t, ctrl, http.MethodDelete, url, nil); r.code != http.StatusOK {
		t.Fatalf("DELETE by the controller: %d %s", r.code, r.body)
	}
	if r := do(t, c, http.MethodGet, url, nil); r.code != http.StatusNoContent {
		t.Fatalf("GET after DELETE: %d", r.code)
	}
}

// A runner of Stack A cannot read, write or lock Stack B's state, in its
// own namespace or another; the controller can use both.
func TestRunnerMayUseOnlyItsOwnStack(t *testing.T) {
	f := newFixture(t, httpbackend.Options{})
	nsA, nsB := uniqueName("a-"), uniqueName("b-")
	own := state.Key{Namespace: nsA, Stack: "stack-a", Workspace: "default"}
	f.runs.startRun(t, nsA, "stack-a", "run-1")
	runnerA := f.client(t, pki.RunnerIdentity(nsA, "stack-a", "run-1"))
	ctrl := f.client(t, pki.ControllerIdentity)
	seed := storetest.StateJSON("l", 1, 0, 100)
	for _, target := range []state.Key{
		{Namespace: nsA, Stack: "stack-b", Workspace: "default"}, // same namespace
		{Namespace: nsB, Stack: "stack-a", Workspace: "default"}, // same name, other namespace
		{Namespace: nsB, Stack: "stack-b", Workspace: "default"},
	} {
		url := httpbackend.Address(f.baseURL, target)
		if r := do(t, ctrl, http.MethodPost, url, seed); r.code != http.StatusOK {
			t.Fatalf("controller POST %s: %d %s", target, r.code, r.body)
		}
		for _, m := range []struct {
			method string
			body   []byte
		}{
			{http.MethodGet, nil},
			{http.MethodPost, storetest.StateJSON("l", 2, 0, 100)},
			{httpbackend.MethodLock, lockBody(t, state.LockInfo{ID: "x"})},
			{httpbackend.MethodUnlock, lockBody(t, state.LockInfo{ID: "x"})},
			{http.MethodDelete, nil},
		} {
			r := do(t, runnerA, m.method, url, m.body)
			if r.code != http.StatusForbidden {
				t.Fatalf("runner of %s: %s %s answered %d %s, want 403", own, m.method, target, r.code, r.body)
			}
			if bytes.Contains(r.body, []byte(`"lineage"`)) {
				t.Fatalf("403 body leaks state: %s", r.body)
			}
		}
		if got, err := f.store.Get(t.Context(), target); err != nil || got.Serial != 1 {
			t.Fatalf("state %s changed behind the 403s: %+v %v", target, got, err)
		}
		if lock, err := f.store.GetLock(t.Context(), target); err != nil || lock != nil {
			t.Fatalf("state %s got locked behind a 403: %+v %v", target, lock, err)
		}
		if r := do(t, ctrl, http.MethodGet, url, nil); r.code != http.StatusOK {
			t.Fatalf("controller GET %s: %d", target, r.code)
		}
	}
	if r := do(t, runnerA, http.MethodPost, httpbackend.Address(f.baseURL, own), seed); r.code != http.StatusOK {
		t.Fatalf("runner POST to its own state: %d %s", r.code, r.body)
	}
}

// Without a client certificate from the CA there is no conversation at all.
func TestClientCertificateRequired(t *testing.T) {
	f := newFixture(t, httpbackend.Options{})
	url := httpbackend.Address(f.baseURL, state.Key{Namespace: "ns", Stack: "s", Workspace: "default"})
	noCert := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the test checks the server refuses this client
	if _, err := noCert.Get(url); err == nil {
		t.Fatal("a client without a certificate was served")
	}
	other, err := pki.NewAuthority(pki.DefaultCAValidity)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := other.Issue(pki.LeafRequest{Identity: pki.ControllerIdentity, Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := foreign.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	foreignClient := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{cert}}}} //nolint:gosec // as above
	if _, err := foreignClient.Get(url); err == nil {
		t.Fatal("a client with a certificate from another CA was served")
	}
}
