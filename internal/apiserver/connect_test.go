package apiserver

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/structpb"

	apiv1 "github.com/terrace-dev/terrace/proto/terrace/api/v1"
	"github.com/terrace-dev/terrace/proto/terrace/api/v1/apiv1connect"
)

// h2Client speaks HTTP/2 over TLS, as gRPC needs.
func (at *apiTest) h2Client() *http.Client {
	tr := at.http.Transport.(*http.Transport).Clone()
	tr.ForceAttemptHTTP2 = true
	tr.TLSClientConfig = tr.TLSClientConfig.Clone()
	tr.TLSClientConfig.NextProtos = []string{"h2"}
	return &http.Client{Timeout: 30 * time.Second, Transport: tr}
}

// grpcClient is the generated client speaking gRPC.
func (at *apiTest) grpcClient() apiv1connect.InstallationServiceClient {
	return apiv1connect.NewInstallationServiceClient(at.h2Client(), at.url, connect.WithGRPC())
}

func withToken[T any](msg *T, token string) *connect.Request[T] {
	req := connect.NewRequest(msg)
	req.Header().Set("Authorization", "Bearer "+token)
	return req
}

// expectCode fails unless err is a connect error with code and ErrorInfo reason.
func expectCode(t *testing.T, err error, code connect.Code, reason string, parts ...string) {
	t.Helper()
	var cerr *connect.Error
	if !errors.As(err, &cerr) || cerr.Code() != code {
		t.Fatalf("error %v, want code %v", err, code)
	}
	got := ""
	for _, d := range cerr.Details() {
		if v, err := d.Value(); err == nil {
			if info, ok := v.(*errdetails.ErrorInfo); ok && info.Domain == errorDomain {
				got = info.Reason
			}
		}
	}
	if got != reason {
		t.Fatalf("error %v: ErrorInfo reason %q, want %q", err, got, reason)
	}
	for _, part := range parts {
		if !strings.Contains(cerr.Message(), part) {
			t.Fatalf("message %q does not contain %q", cerr.Message(), part)
		}
	}
}

// TestOnePortEveryProtocol: the installation created over gRPC is the one
// read over Connect JSON (a plain HTTP POST) and over the REST path, on the
// same listener, which also answers gRPC health and reflection.
func TestOnePortEveryProtocol(t *testing.T) {
	at := newAPITest(t)
	ctx := context.Background()
	grpc := at.grpcClient()

	values, err := structpb.NewStruct(map[string]any{"replicas": 3, "tags": []any{"a", "b"}})
	if err != nil {
		t.Fatal(err)
	}
	created, err := grpc.Create(ctx, withToken(&apiv1.CreateRequest{
		Name: "web", Source: &apiv1.Source{ProgramRef: "web-module"}, Values: values,
	}, at.admin))
	if err != nil {
		t.Fatal(err)
	}
	if created.Msg.GetName() != "web" || created.Msg.GetSource().GetProgramRef() != "web-module" || !strings.HasPrefix(created.Msg.GetValuesSecret(), "web-values-") {
		t.Fatalf("created: %v", created.Msg)
	}
	if data := at.valuesSecret("web").Data; string(data["replicas"]) != "3" || string(data["tags"]) != `["a","b"]` {
		t.Fatalf("values Secret: %q", data)
	}

	// Connect JSON: a plain POST of the request message.
	req, err := http.NewRequest(http.MethodPost, at.url+"/terrace.api.v1.InstallationService/Get", strings.NewReader(`{"name":"web"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+at.admin)
	resp, err := at.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var got struct {
		Name         string `json:"name"`
		ValuesSecret string `json:"valuesSecret"`
		Phase        string `json:"phase"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &got) != nil || got.Name != "web" || got.ValuesSecret != created.Msg.GetValuesSecret() || got.Phase != phasePending {
		t.Fatalf("Connect JSON Get: %d %s", resp.StatusCode, raw)
	}

	// The REST path.
	var one Installation
	at.expect(http.StatusOK, at.admin, http.MethodGet, "/v1/installations/web", nil, &one)
	if one.Name != "web" || one.Source.ProgramRef != "web-module" {
		t.Fatalf("REST get: %+v", one)
	}

	// Errors are codes with reasons, in every protocol.
	_, err = grpc.Get(ctx, withToken(&apiv1.GetRequest{Name: "gone"}, at.admin))
	expectCode(t, err, connect.CodeNotFound, reasonNotFound, "Stack gone in namespace "+at.namespace+" not found")
	_, err = grpc.Get(ctx, withToken(&apiv1.GetRequest{Name: "web"}, at.nobody))
	expectCode(t, err, connect.CodePermissionDenied, reasonForbidden, `User "system:serviceaccount:`+at.namespace+`:nobody" cannot get resource "stacks"`)
	_, err = grpc.Get(ctx, connect.NewRequest(&apiv1.GetRequest{Name: "web"}))
	expectCode(t, err, connect.CodeUnauthenticated, reasonUnauthenticated, "a bearer token is required")
	connectJSON := apiv1connect.NewInstallationServiceClient(at.http, at.url, connect.WithProtoJSON())
	_, err = connectJSON.Create(ctx, withToken(&apiv1.CreateRequest{Name: "web", Source: &apiv1.Source{ProgramRef: "web-module"}}, at.admin))
	expectCode(t, err, connect.CodeAlreadyExists, reasonAlreadyExists, "Stack web already exists")
	var e Error
	at.expect(http.StatusNotFound, at.admin, http.MethodGet, "/v1/installations/gone", nil, &e)
	if e.Code != http.StatusNotFound || e.Reason != reasonNotFound {
		t.Fatalf("REST error: %+v", e)
	}

	// gRPC health and reflection, without a token.
	health, err := grpchealth.NewClient(at.h2Client(), at.url, connect.WithGRPC()).Check(ctx, &grpchealth.CheckRequest{Service: apiv1connect.InstallationServiceName})
	if err != nil || health.Status != grpchealth.StatusServing {
		t.Fatalf("health: %v %v", health, err)
	}
	stream := grpcreflect.NewClient(at.h2Client(), at.url, connect.WithGRPC()).NewStream(ctx)
	services, err := stream.ListServices()
	if err != nil {
		t.Fatal(err)
	}
	_, _ = stream.Close()
	if !slices.Contains(services, apiv1connect.InstallationServiceName) {
		t.Fatalf("reflection lists %v", services)
	}
}

func TestListPages(t *testing.T) {
	at := newAPITest(t)
	ctx := context.Background()
	grpc := at.grpcClient()
	for _, name := range []string{"c", "a", "b"} {
		if _, err := grpc.Create(ctx, withToken(&apiv1.CreateRequest{Name: name, Source: &apiv1.Source{ProgramRef: "m"}}, at.admin)); err != nil {
			t.Fatal(err)
		}
	}
	first, err := grpc.List(ctx, withToken(&apiv1.ListRequest{PageSize: 2}, at.admin))
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Msg.Items) != 2 || first.Msg.Items[0].Name != "a" || first.Msg.Items[1].Name != "b" || first.Msg.NextPageToken == "" {
		t.Fatalf("first page: %v", first.Msg)
	}
	second, err := grpc.List(ctx, withToken(&apiv1.ListRequest{PageSize: 2, PageToken: first.Msg.NextPageToken}, at.admin))
	if err != nil {
		t.Fatal(err)
	}
	if len(second.Msg.Items) != 1 || second.Msg.Items[0].Name != "c" || second.Msg.NextPageToken != "" {
		t.Fatalf("second page: %v", second.Msg)
	}
	// The REST path takes the same parameters.
	code, raw := at.do(at.admin, http.MethodGet, "/v1/installations?pageSize=1", nil)
	var page struct {
		Items         []Installation `json:"items"`
		NextPageToken string         `json:"nextPageToken"`
	}
	if code != http.StatusOK || json.Unmarshal(raw, &page) != nil || len(page.Items) != 1 || page.NextPageToken == "" {
		t.Fatalf("REST page: %d %s", code, raw)
	}
	_, err = grpc.List(ctx, withToken(&apiv1.ListRequest{PageToken: "garbage"}, at.admin))
	expectCode(t, err, connect.CodeInvalidArgument, reasonInvalidInput, "pageToken")
}

func TestApproveAStalePlanIsFailedPrecondition(t *testing.T) {
	at := newAPITest(t)
	ctx := context.Background()
	grpc := at.grpcClient()
	if _, err := grpc.Create(ctx, withToken(&apiv1.CreateRequest{Name: "web", Source: &apiv1.Source{ProgramRef: "m"}}, at.admin)); err != nil {
		t.Fatal(err)
	}
	_, err := grpc.ApprovePlan(ctx, withToken(&apiv1.ApprovePlanRequest{Name: "web", PlanId: "plan-1-a"}, at.admin))
	expectCode(t, err, connect.CodeFailedPrecondition, reasonNoPlan, "no plan is pending")
	at.setPending("web", "plan-7-abc")
	_, err = grpc.ApprovePlan(ctx, withToken(&apiv1.ApprovePlanRequest{Name: "web", PlanId: "plan-6-old"}, at.admin))
	expectCode(t, err, connect.CodeFailedPrecondition, reasonPlanNotPending, "plan-7-abc is")
	approved, err := grpc.ApprovePlan(ctx, withToken(&apiv1.ApprovePlanRequest{Name: "web", PlanId: "plan-7-abc"}, at.admin))
	if err != nil || approved.Msg.ApprovePlan != "plan-7-abc" {
		t.Fatalf("approve: %v %v", approved, err)
	}
	plan, err := grpc.GetPlan(ctx, withToken(&apiv1.GetPlanRequest{Name: "web"}, at.admin))
	if err != nil || plan.Msg.Id != "plan-7-abc" {
		t.Fatalf("plan: %v %v", plan, err)
	}
}
