package cli

import (
	"bytes"
	"runtime"
	"strings"
	"testing"
)

func TestVersionPrintsVersionCommitAndGo(t *testing.T) {
	cmd := NewRootCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"version"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{"terrace ", "commit ", runtime.Version()} {
		if !strings.Contains(got, want) {
			t.Errorf("version output %q lacks %q", got, want)
		}
	}
}
