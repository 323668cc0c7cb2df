package stackview

import (
	"strings"
	"testing"
)

func TestShortRevision(t *testing.T) {
	full := "sha256:e3f62017" + strings.Repeat("a", 56)
	sha1 := "main@sha1:0123456789abcdef0123456789abcdef01234567"
	cases := map[string]string{
		"1@" + full:                            "1@sha256:e3f62017",
		"applied 1@" + full + " (release 3)":   "applied 1@sha256:e3f62017 (release 3)",
		sha1:                                   "main@sha1:01234567",
		"main@sha1:abc":                        "main@sha1:abc",
		"":                                     "",
		"no digest here, plan-4-0123456789abc": "no digest here, plan-4-0123456789abc",
	}
	for in, want := range cases {
		if got := ShortRevision(in); got != want {
			t.Errorf("ShortRevision(%q) = %q, want %q", in, got, want)
		}
	}
}
