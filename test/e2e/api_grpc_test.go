package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/config"
	terraceclient "github.com/terrace-dev/terrace/pkg/client"
	apiv1 "github.com/terrace-dev/terrace/proto/terrace/api/v1"
)

// TestInstallationsAPIEveryProtocolOnTheDevCluster: on the dev cluster, the
// API pod the controller runs takes the same installation through gRPC (the
// generated Go client, pkg/client), Connect JSON (a plain HTTP POST) and the
// REST path; the controller applies each; a Watch follows one from
// Planning to Ready; a caller without rights is PERMISSION_DENIED with the
// Kubernetes API's message naming them.
func TestInstallationsAPIEveryProtocolOnTheDevCluster(t *testing.T) {
	e := newStackEnv(t)
	podIP := e.enableAPI(t)
	base := fmt.Sprintf("https://%s:%d", podIP, config.APIPort)
	https := e.apiHTTPClient(t)
	token := e.toolToken(t, "deployer")
	ctx, cancel := context.WithTimeout(context.Background(), stackTimeout)
	defer cancel()

	grpc, err := terraceclient.New(base, terraceclient.Options{Token: terraceclient.StaticToken(token), HTTPClient: https})
	if err != nil {
		t.Fatal(err)
	}
	values := func(n int) map[string]any { return map[string]any{"n": n} }
	// gRPC: follow it with Watch from the start.
	created, err := grpc.Create(ctx, connect.NewRequest(&apiv1.CreateRequest{
		Name: "by-grpc", Source: &apiv1.Source{ProgramRef: "bench"}, ApprovePlan: terracev1.ApprovePlanAuto, Values: mustStructE2E(t, values(1)),
	}))
	if err != nil {
		t.Fatal(err)
	}
	stream, err := grpc.Watch(ctx, connect.NewRequest(&apiv1.WatchRequest{Name: created.Msg.Name}))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stream.Close() }()

	// Connect JSON and REST: the same request as plain JSON.
	body := func(name string) string {
		raw, _ := json.Marshal(map[string]any{"name": name, "source": map[string]string{"programRef": "bench"}, "approvePlan": "auto", "values": values(2)})
		return string(raw)
	}
	post := func(path, payload string, want int) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, base+path, strings.NewReader(payload))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := https.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("POST %s: %d, want %d: %s", path, resp.StatusCode, want, raw)
		}
	}
	post("/terrace.api.v1.InstallationService/Create", body("by-connect"), http.StatusOK)
	post("/v1/installations", body("by-rest"), http.StatusCreated)
	// REST follows it with the watch route (newline-delimited JSON), read below.
	restLines := restWatch(ctx, t, https, base+"/v1/installations/by-rest/watch", token)

	var phases []string
	for stream.Receive() {
		in := stream.Msg().GetInstallation()
		if len(phases) == 0 || phases[len(phases)-1] != in.Phase {
			phases = append(phases, in.Phase)
		}
		if in.Ready {
			break
		}
		if in.Phase == "Failed" {
			t.Fatalf("the installation failed: %v", in)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("watch: %v (phases %v)", err, phases)
	}
	t.Logf("phases seen by Watch: %v", phases)
	if !slices.Contains(phases, "Planning") || phases[len(phases)-1] != "Ready" || slices.Index(phases, "Planning") > slices.Index(phases, "Ready") {
		t.Fatalf("Watch saw %v, want Planning before Ready", phases)
	}
	var restPhases []string
	for restLines.Scan() {
		var ev struct {
			Installation struct {
				Phase string `json:"phase"`
				Ready bool   `json:"ready"`
			} `json:"installation"`
		}
		if err := json.Unmarshal(restLines.Bytes(), &ev); err != nil {
			t.Fatalf("REST watch line %q: %v", restLines.Text(), err)
		}
		if len(restPhases) == 0 || restPhases[len(restPhases)-1] != ev.Installation.Phase {
			restPhases = append(restPhases, ev.Installation.Phase)
		}
		if ev.Installation.Ready {
			break
		}
	}
	t.Logf("phases seen by the REST watch: %v", restPhases)
	if len(restPhases) == 0 || restPhases[len(restPhases)-1] != "Ready" || !slices.Contains(restPhases, "Planning") {
		t.Fatalf("the REST watch saw %v (%v), want Planning then Ready", restPhases, restLines.Err())
	}
	for _, name := range []string{"by-grpc", "by-connect", "by-rest"} {
		e.waitStack(t, name, stackTimeout, "the installation applied", readyAt)
		got, err := grpc.Get(ctx, connect.NewRequest(&apiv1.GetRequest{Name: name}))
		if err != nil || !got.Msg.Ready || got.Msg.Release != 1 {
			t.Fatalf("%s: %v %v", name, got, err)
		}
		// Each reads the values from a Secret of its own, owned by its Stack.
		secret := &corev1.Secret{}
		if err := e.c.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: got.Msg.ValuesSecret}, secret); err != nil || len(secret.OwnerReferences) != 1 {
			t.Fatalf("%s: values Secret %s: %v %+v", name, got.Msg.ValuesSecret, err, secret.OwnerReferences)
		}
	}

	nobody, err := terraceclient.New(base, terraceclient.Options{Token: terraceclient.StaticToken(e.toolTokenWithoutRights(t, "nobody")), HTTPClient: https})
	if err != nil {
		t.Fatal(err)
	}
	_, err = nobody.Get(ctx, connect.NewRequest(&apiv1.GetRequest{Name: "by-grpc"}))
	var cerr *connect.Error
	if !errors.As(err, &cerr) || cerr.Code() != connect.CodePermissionDenied || terraceclient.Reason(err) != "FORBIDDEN" ||
		!strings.Contains(cerr.Message(), `User "system:serviceaccount:`+e.ns+`:nobody"`) {
		t.Fatalf("a caller without rights: %v", err)
	}
	_, err = grpc.Create(ctx, connect.NewRequest(&apiv1.CreateRequest{Cluster: "nowhere", Name: "lost", Source: &apiv1.Source{ProgramRef: "bench"}}))
	if terraceclient.Reason(err) != "UNKNOWN_CLUSTER" {
		t.Fatalf("an unknown cluster: %v", err)
	}
	if err := e.c.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: "lost"}, &terracev1.Stack{}); err == nil {
		t.Fatal("a create for an unknown cluster made a Stack")
	}
}

// restWatch starts GET url (a REST watch) and returns its lines; the
// response is closed when the test ends.
func restWatch(ctx context.Context, t *testing.T, https *http.Client, url, token string) *bufio.Scanner {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := https.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = resp.Body.Close() })
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		raw, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %d %q: %s", url, resp.StatusCode, resp.Header.Get("Content-Type"), raw)
	}
	return bufio.NewScanner(resp.Body)
}

// enableAPI installs a Program bench, turns the namespace's API server on,
// and returns the IP of its Ready pod.
func (e *stackEnv) enableAPI(t *testing.T) string {
	t.Helper()
	e.program(t, "bench", map[string]string{"main.tf": benchModule})
	e.create(t, &terracev1.TerraceConfig{
		ObjectMeta: metav1.ObjectMeta{Name: terracev1.TerraceConfigName},
		Spec:       terracev1.TerraceConfigSpec{API: &terracev1.APIConfig{Enabled: true}},
	})
	return e.readyAPIPod(t)
}

// readyAPIPod waits for a Ready API server pod of the namespace and returns
// its IP. When the test ends it turns the API off and waits for the pod to
// go, so that the next test starts from a namespace without it.
func (e *stackEnv) readyAPIPod(t *testing.T) string {
	t.Helper()
	t.Cleanup(func() {
		ctx := context.Background()
		cfg := &terracev1.TerraceConfig{}
		if err := e.c.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: terracev1.TerraceConfigName}, cfg); err != nil || cfg.Spec.API == nil {
			return
		}
		cfg.Spec.API.Enabled = false
		if err := e.c.Update(ctx, cfg); err != nil {
			t.Errorf("failed to turn the API off: %v", err)
			return
		}
		eventually(t, stackTimeout, "the API server pod gone", func() error {
			pods, err := e.cs.CoreV1().Pods(e.ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + config.APIName})
			if err != nil || len(pods.Items) > 0 {
				return fmt.Errorf("%d API pods left (%v)", len(pods.Items), err)
			}
			return nil
		})
	})
	var podIP string
	eventually(t, stackTimeout, "a Ready API server pod", func() error {
		pods, err := e.cs.CoreV1().Pods(e.ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + config.APIName})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			if podReady(&p) {
				podIP = p.Status.PodIP
				return nil
			}
		}
		return fmt.Errorf("%d pods, none Ready", len(pods.Items))
	})
	return podIP
}

// apiHTTPClient speaks HTTP/2 and HTTP/1.1 to the API pod, trusting the CA
// its certificate Secret carries and checking the Service's name.
func (e *stackEnv) apiHTTPClient(t *testing.T) *http.Client {
	t.Helper()
	var secret corev1.Secret
	if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: config.APITLSSecretName}, &secret); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(secret.Data["ca.crt"]) {
		t.Fatal("no CA in the API certificate Secret")
	}
	return &http.Client{Timeout: 0, Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: pool, ServerName: config.APIName + "." + e.ns + ".svc", MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2: true,
	}}
}

func mustStructE2E(t *testing.T, m map[string]any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
