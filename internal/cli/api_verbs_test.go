package cli

import (
	"bytes"
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/terrace-dev/terrace/internal/testenv"
)

// TestVerbsTalkToTheAPI runs `terrace api` in-process and the verbs with
// --api against it, as the caller's own ServiceAccount token.
func TestVerbsTalkToTheAPI(t *testing.T) {
	env, kubeconfig := apiServer(t)
	ns := env.Namespace(t)
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	token := installerToken(t, cs, ns)
	certFile, keyFile, pool := testenv.ServingCert(t)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		cmd := NewRootCommand()
		cmd.SetOut(&bytes.Buffer{})
		cmd.SetErr(&bytes.Buffer{})
		cmd.SetArgs([]string{"api", "-n", ns, "--listen", addr, "--tls-cert-file", certFile, "--tls-key-file", keyFile, "--kubeconfig", kubeconfig})
		served <- cmd.ExecuteContext(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("terrace api: %v", err)
		}
	})
	url := "https://" + addr
	// Wait for the listener.
	deadline := time.Now().Add(20 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = conn.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("terrace api never listened")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// An installation made through the REST path.
	https := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	req, err := http.NewRequest(http.MethodPost, url+"/v1/installations", strings.NewReader(`{"name":"app","source":{"programRef":"m"},"values":{"n":1}}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := https.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("REST create: %d", resp.StatusCode)
	}

	api := func(args ...string) (string, string, error) {
		t.Helper()
		return verb(t, append(args, "--api", url, "--api-ca-file", certFile, "--token", token)...)
	}
	newStack(t, ns, "web", nil, nil)
	out, _, err := api("get")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "app") || !strings.Contains(out, "Pending") || strings.Contains(out, "web") {
		t.Fatalf("get lists installations only:\n%s", out)
	}
	if out, _, err := api("get", "app"); err != nil || !strings.Contains(out, "app") {
		t.Fatalf("get app: %v\n%s", err, out)
	}
	if _, _, err := api("plan", "app"); err == nil || !strings.Contains(err.Error(), "no plan is pending") {
		t.Fatalf("plan before any: %v", err)
	}
	if _, _, err := verb(t, "get", "web", "--api", url, "--api-ca-file", certFile, "--token", "not-a-token"); err == nil || !strings.Contains(err.Error(), "was not accepted") {
		t.Fatalf("a bad token: %v", err)
	}
	for _, protocol := range []string{"grpc", "grpc-web", "connect", "connect-json"} {
		if _, _, err := api("get", "--api-protocol", protocol); err != nil {
			t.Fatalf("%s: %v", protocol, err)
		}
	}
	// A Stack made without the API is read through it too (not listed by get).
	_, _, err = api("plan", "web")
	if err == nil || !strings.Contains(err.Error(), "no plan is pending for Stack "+ns+"/web") {
		t.Fatalf("plan of a plain Stack: %v", err)
	}
	_, _, err = api("get", "--cluster", "elsewhere")
	if err == nil || !strings.Contains(err.Error(), "cluster elsewhere is not known") {
		t.Fatalf("an unknown cluster: %v", err)
	}
	// Without --api the verbs still talk to the Kubernetes API.
	if out, _, err := verb(t, "get", "web", "-n", ns); err != nil || !strings.Contains(out, "web") {
		t.Fatalf("get without --api: %v\n%s", err, out)
	}
}

// installerToken makes a ServiceAccount with the rights docs/api.md tells
// a tool's Role to grant, and returns a token for it.
func installerToken(t *testing.T, cs kubernetes.Interface, ns string) string {
	t.Helper()
	ctx := context.Background()
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "installer"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "installer"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"terrace.dev"}, Resources: []string{"stacks"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "list", "create", "update", "patch", "delete"}},
	}}
	if _, err := cs.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "installer"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "installer"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "installer", Namespace: ns}},
	}
	if _, err := cs.RbacV1().RoleBindings(ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "installer", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}
