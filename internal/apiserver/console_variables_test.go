package apiserver

import (
	"context"
	"strings"
	"testing"

	"connectrpc.com/connect"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	apiv1 "github.com/terrace-dev/terrace/proto/terrace/api/v1"
)

// TestProgramVariablesSurviveNestingBombs is the attack of a Stack author
// on the API server every caller of the namespace shares: a Program whose
// file nests so deep that HCL's parsers overflow the goroutine stack when
// the console asks for its variables, a fatal error that ends the server.
// Before the nesting check each of these crashed this test binary; now the
// caller gets INVALID_ARGUMENT naming file:line:col, and a deep but sane
// Program still lists its variables.
func TestProgramVariablesSurviveNestingBombs(t *testing.T) {
	at := newAPITest(t)
	ctx := context.Background()
	api := at.grpcClient()
	reader := serviceAccountToken(t, mustClientset(t), at.namespace, "program-reader", []rbacv1.PolicyRule{
		{APIGroups: []string{"terrace.dev"}, Resources: []string{"programs"}, Verbs: []string{"get"}},
	})
	variables := `variable "region" { default = "eu" }` + "\n"
	for _, tc := range []struct {
		program, file, content, want string
	}{
		{program: "hcl-bomb", file: "main.tf", content: "a = " + strings.Repeat("[", 60000), want: "main.tf:1:261: nesting deeper than 256 levels"},
		{program: "json-bomb", file: "main.tf.json", content: strings.Repeat("[", 500000), want: "main.tf.json:1:257: nesting deeper than 256 levels"},
		{program: "negation-bomb", file: "main.tf", content: "locals {\n  a = " + strings.Repeat("-", 500000) + "1\n}\n", want: "main.tf:2:"},
	} {
		t.Run(tc.program, func(t *testing.T) {
			files := map[string]terracev1.ProgramFile{"variables.tf": terracev1.ProgramFile(variables), tc.file: terracev1.ProgramFile(tc.content)}
			program := &terracev1.Program{ObjectMeta: metav1.ObjectMeta{Namespace: at.namespace, Name: tc.program}, Spec: terracev1.ProgramSpec{Files: files}}
			if err := env.Client.Create(ctx, program); err != nil {
				t.Fatal(err)
			}
			_, err := api.GetProgramVariables(ctx, withToken(&apiv1.GetProgramVariablesRequest{Program: tc.program}, reader))
			expectCode(t, err, connect.CodeInvalidArgument, reasonInvalidInput, tc.want, "nesting deeper than 256 levels")
		})
	}

	deep := strings.Repeat("[", 200) + strings.Repeat("]", 200)
	sane := &terracev1.Program{ObjectMeta: metav1.ObjectMeta{Namespace: at.namespace, Name: "deep-but-sane"}, Spec: terracev1.ProgramSpec{Files: map[string]terracev1.ProgramFile{
		"variables.tf":      terracev1.ProgramFile(`variable "matrix" { default = ` + deep + " }\n" + variables),
		"variables.tf.json": terracev1.ProgramFile(`{"variable": {"tree": {"default": ` + strings.Repeat(`{"a":`, 200) + "1" + strings.Repeat("}", 200) + `}}}`),
	}}}
	if err := env.Client.Create(ctx, sane); err != nil {
		t.Fatal(err)
	}
	out, err := api.GetProgramVariables(ctx, withToken(&apiv1.GetProgramVariablesRequest{Program: "deep-but-sane"}, reader))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, v := range out.Msg.GetItems() {
		names = append(names, v.GetName())
	}
	if strings.Join(names, ",") != "matrix,region,tree" {
		t.Fatalf("variables %v", names)
	}
}
