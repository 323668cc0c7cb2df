package stack

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/artifact/artifactserver"
)

// connectionCounter is a TCP listener that counts and drops every
// connection: the address a Program's status.artifact names in these
// tests, which no run should dial.
func connectionCounter(t *testing.T) (addr string, dialled *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	dialled = &atomic.Int64{}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			dialled.Add(1)
			_ = conn.Close()
		}
	}()
	return ln.Addr().String(), dialled
}

// program creates a Program and writes the status its controller would
// (Ready at its generation, the artifact), with digest in place of the
// built tarball's when it is not empty.
func (e *suiteEnv) program(name, module, artifactHost, digest string) {
	e.t.Helper()
	ctx := context.Background()
	p := &terracev1.Program{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns}, Spec: terracev1.ProgramSpec{Files: map[string]terracev1.ProgramFile{"main.tf": terracev1.ProgramFile(module)}}}
	if err := e.c.Create(ctx, p); err != nil {
		e.t.Fatal(err)
	}
	data, built, err := artifactserver.BuildProgram(p)
	if err != nil {
		e.t.Fatal(err)
	}
	if digest == "" {
		digest = built
	}
	size := int64(len(data))
	p.Status = terracev1.ProgramStatus{
		ObservedGeneration: p.Generation,
		Conditions: []metav1.Condition{{
			Type: terracev1.ReadyCondition, Status: metav1.ConditionTrue, Reason: "Succeeded", Message: "artifact built",
			ObservedGeneration: p.Generation, LastTransitionTime: metav1.Now(),
		}},
		Artifact: &terracev1.Artifact{
			URL:            artifactserver.ProgramURL("https://"+artifactHost, e.ns, name, p.Generation),
			Revision:       artifactserver.ProgramRevision(p.Generation, digest),
			Digest:         digest,
			Size:           &size,
			LastUpdateTime: metav1.Now(),
		},
	}
	if err := e.c.Status().Update(ctx, p); err != nil {
		e.t.Fatal(err)
	}
}

func (e *suiteEnv) programStack(name, program string) {
	e.t.Helper()
	st := &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns}, Spec: terracev1.StackSpec{
		Source:      terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: program}},
		Vars:        map[string]apiextensionsv1.JSON{"greeting": {Raw: []byte(`"from a Program"`)}},
		ApprovePlan: terracev1.ApprovePlanAuto,
	}}
	if err := e.c.Create(context.Background(), st); err != nil {
		e.t.Fatal(err)
	}
}

// A Program's tarball reaches the runner over the run's own connection:
// the runner opens none to the artifact server.
func TestEnvtestAProgramIsUploadedToTheRunner(t *testing.T) {
	e := newSuiteEnv(t)
	addr, dialled := connectionCounter(t)
	e.program("web", dataModule, addr, "")
	e.programStack("web", "web")
	st := e.waitFor("web", "Ready", readyAt)
	if st.Status.Release == nil || !strings.HasPrefix(st.Status.LastAppliedRevision, "1@sha256:") {
		t.Fatalf("release %+v, last applied revision %q", st.Status.Release, st.Status.LastAppliedRevision)
	}
	if n := dialled.Load(); n != 0 {
		t.Fatalf("the run dialled the artifact server %d times; the Program should have been uploaded", n)
	}
}

// A Program whose status.artifact names another tarball than its files
// build to is not deployed, and no run starts: the Stack waits for the
// Program's status.
func TestEnvtestAProgramWhoseArtifactDisagreesIsNotDeployed(t *testing.T) {
	e := newSuiteEnv(t)
	addr, dialled := connectionCounter(t)
	other := "sha256:" + strings.Repeat("0", 64)
	e.program("web", dataModule, addr, other)
	e.programStack("web", "web")
	// Before the controller's cache has the Program's status, the Stack
	// waits with the same reason for an artifact: wait for the digest's.
	st := e.waitFor("web", "waiting for the Program's status", func(st *terracev1.Stack) bool {
		return is(terracev1.ReadyCondition, "False", SourceNotReadyReason)(st) && strings.Contains(conditionsText(st), "its status.artifact says "+other)
	})
	if st.Status.Release != nil || st.Status.LastRun != "" || dialled.Load() != 0 {
		t.Fatalf("release %+v, run %q, %d connections to the artifact server; want no run at all", st.Status.Release, st.Status.LastRun, dialled.Load())
	}
}
