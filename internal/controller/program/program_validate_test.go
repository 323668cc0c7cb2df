package program

import (
	"strings"
	"testing"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

func TestValidateFiles(t *testing.T) {
	for _, tc := range []struct {
		name    string
		files   map[string]terracev1.ProgramFile
		wantErr string // "" means valid
	}{
		{name: "valid module", files: files("main.tf", "locals { a = 1 }\n", "x.tofu", "locals {}\n", "y.tf.json", `{"locals":{"b":2}}`, "prod.tfvars", "a = 1\n", "p.tfvars.json", `{"a":1}`, "tests/a.tftest.hcl", "run \"x\" {}\n")},
		{name: "templates are not parsed", files: files("main.tf", "locals {}\n", "templates/x.tpl", "${{{ not hcl", "README.md", "# }}}")},
		{name: "invalid hcl names file, line and column", files: files("main.tf", "locals {}\n", "modules/x/main.tf", "locals {\n  a = 1\n  b = = 2\n}\n"), wantErr: "modules/x/main.tf:3:7: Invalid expression"},
		{name: "unclosed block", files: files("main.tf", "resource \"a\" \"b\" {\n"), wantErr: "main.tf:1:"},
		{name: "invalid tfvars", files: files("prod.tfvars", "a = \n"), wantErr: "prod.tfvars:"},
		{name: "invalid tofu file", files: files("main.tofu", "locals {{\n"), wantErr: "main.tofu:1:"},
		{name: "invalid json", files: files("main.tf.json", `{"locals": }`), wantErr: "main.tf.json:1:"},
		{name: "invalid tfvars json", files: files("a.tfvars.json", `[`), wantErr: "a.tfvars.json:1:"},
		{name: "errors in several files are all named, in order", files: files("b.tf", "b {\n", "a.tf", "a {\n"), wantErr: "a.tf:1:"},
		{name: "bad name", files: files("../x.tf", "locals {}\n"), wantErr: `invalid file name "../x.tf"`},
		{name: "too large", files: files("a.tf", strings.Repeat("#\n", terracev1.ProgramMaxTotalSize/2+1)), wantErr: "more than the 524288 allowed"},
		{name: "empty", files: files(), wantErr: "no files"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := validateFiles(tc.files)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.wantErr != "" && err == nil:
				t.Fatal("accepted")
			case tc.wantErr != "" && !strings.HasPrefix(err.Error(), tc.wantErr) && !strings.Contains(err.Error(), tc.wantErr):
				t.Fatalf("error %q does not name %q", err, tc.wantErr)
			}
		})
	}
}

func TestValidateFilesReportsTheFirstFewDiagnostics(t *testing.T) {
	f := map[string]terracev1.ProgramFile{}
	for _, n := range []string{"a", "b", "c", "d", "e", "f", "g"} {
		f[n+".tf"] = "x = = 1\n"
	}
	err := validateFiles(f)
	if err == nil {
		t.Fatal("accepted")
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "a.tf:1:") || !strings.Contains(msg, "e.tf:1:") || strings.Contains(msg, "f.tf:") || !strings.HasSuffix(msg, "and 2 more") {
		t.Fatalf("message: %s", msg)
	}
}
