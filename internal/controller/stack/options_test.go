package stack

import (
	"context"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/scheme"
	"github.com/terrace-dev/terrace/internal/settings"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

func TestOptionsDigest(t *testing.T) {
	const base = "sha256:base"
	plain := &terracev1.StackSpec{}
	if got := optionsDigest(base, plain, nil, ""); got != base {
		t.Errorf("a Stack without run options changed its digest: %s", got)
	}
	seen := map[string]string{}
	for name, spec := range map[string]*terracev1.StackSpec{
		"targets":      {Targets: []string{"a.b"}},
		"replace":      {Replace: []string{"a.b"}},
		"var files":    {VarsFiles: []string{"x.tfvars"}},
		"refresh":      {Refresh: ptr.To(false)},
		"file mapping": {FileMappings: []terracev1.FileMapping{{Location: terracev1.FileMappingHome, Path: "x"}}},
	} {
		versions := []string(nil)
		if len(spec.FileMappings) > 0 {
			versions = []string{"s/k@1"}
		}
		d := optionsDigest(base, spec, versions, "")
		if d == base {
			t.Errorf("%s does not change the digest", name)
		}
		if other, dup := seen[d]; dup {
			t.Errorf("%s and %s give the same digest", name, other)
		}
		seen[d] = name
	}
	if optionsDigest(base, plain, nil, "sha256:p1") == optionsDigest(base, plain, nil, "sha256:p2") {
		t.Error("a policy change does not change the digest")
	}
	if optionsDigest(base, &terracev1.StackSpec{Refresh: ptr.To(true)}, nil, "") != base {
		t.Error("refresh: true (the default) changed the digest")
	}
}

func TestApplyPlanOptions(t *testing.T) {
	s := &scope{stack: &terracev1.Stack{Spec: terracev1.StackSpec{
		Targets: []string{"t.a"}, Replace: []string{"t.b"}, Parallelism: ptr.To[int32](3), Refresh: ptr.To(false),
	}}}
	req := &runnerv1.PlanRequest{Variables: &runnerv1.Variables{}}
	applyPlanOptions(s, req)
	if strings.Join(req.GetTargets(), ",") != "t.a" || strings.Join(req.GetReplace(), ",") != "t.b" || req.GetParallelism() != 3 || !req.GetSkipRefresh() {
		t.Errorf("plan request: %v", req)
	}
	if got := applyRequest(s, "plan-1").GetParallelism(); got != 3 {
		t.Errorf("apply parallelism %d", got)
	}
}

func TestLoadPolicies(t *testing.T) {
	ns := "team"
	good := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "good", Namespace: ns}, Data: map[string]string{
		"a.rego": "package terrace\n\ndeny contains \"x\" if { false }\n", "README": "not a module",
	}}
	broken := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "broken", Namespace: ns}, Data: map[string]string{"b.rego": "package other\n"}}
	empty := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "empty", Namespace: ns}, Data: map[string]string{"x.txt": "x"}}
	c := fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(good, broken, empty).Build()
	r := &Reconciler{Client: c}
	tests := []struct {
		name       string
		refs       []string
		wantReason string
	}{
		{"none", nil, ""},
		{"good", []string{"good"}, ""},
		{"missing", []string{"good", "gone"}, PolicyNotFoundReason},
		{"wrong package", []string{"broken"}, InvalidPolicyReason},
		{"no rego key", []string{"empty"}, InvalidPolicyReason},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var refs []settings.PolicyConfigMap
			for _, n := range tt.refs {
				refs = append(refs, settings.PolicyConfigMap{Namespace: ns, Name: n, Source: ns + "/default"})
			}
			s := &scope{stack: &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Namespace: ns}}, config: settings.Effective{PlanPolicies: refs}}
			p, err := r.loadPolicies(context.Background(), s)
			var terminal *outcome.TerminalError
			switch {
			case tt.wantReason == "" && err != nil:
				t.Fatal(err)
			case tt.wantReason != "" && (!errors.As(err, &terminal) || terminal.Reason != tt.wantReason):
				t.Fatalf("error %v, want terminal %s", err, tt.wantReason)
			case tt.wantReason == "" && (p == nil) != (len(tt.refs) == 0):
				t.Fatalf("policies %v for refs %v", p, tt.refs)
			}
		})
	}
}
