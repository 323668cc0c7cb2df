package devnode

import (
	"errors"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestImageMatches(t *testing.T) {
	cases := []struct {
		image string
		want  bool
	}{
		{"terrace", true},
		{"terrace:dev", true},
		{"ghcr.io/terrace-dev/terrace:dev", true},
		{"localhost:5000/terrace", true},
		{"ghcr.io/terrace-dev/terrace@sha256:0123", true},
		{"ghcr.io/terrace-dev/terrace:v1@sha256:0123", true},
		{"ghcr.io/terrace-dev/not-terrace:dev", false},
		{"terrace/runner:1", false},
		{"nginx", false},
		{"localhost:5000/nginx", false},
	}
	for _, c := range cases {
		if got := imageMatches(c.image, DefaultImages); got != c.want {
			t.Errorf("imageMatches(%q) = %v, want %v", c.image, got, c.want)
		}
	}
	if !imageMatches("registry.local/tools/custom:1", []string{"registry.local/tools/custom"}) {
		t.Error("an exact repository pattern should match")
	}
}

func TestBinaryArgs(t *testing.T) {
	cases := []struct {
		name       string
		container  corev1.Container
		want       []string
		wantReason string
	}{
		{"entrypoint", corev1.Container{Name: "c", Image: "terrace", Args: []string{"runner", "--listen=x"}}, []string{"runner", "--listen=x"}, ""},
		{"command terrace", corev1.Container{Name: "c", Image: "terrace", Command: []string{"terrace", "runner"}, Args: []string{"-v"}}, []string{"runner", "-v"}, ""},
		{"absolute command", corev1.Container{Name: "c", Image: "terrace", Command: []string{"/usr/local/bin/terrace"}}, []string{}, ""},
		{"lean runner", corev1.Container{Name: "c", Image: "terrace", Command: []string{"/usr/local/bin/terrace-runner"}, Args: []string{"--listen=x"}}, []string{"runner", "--listen=x"}, ""},
		{"kubectl plugin name", corev1.Container{Name: "c", Image: "terrace", Command: []string{"/kubectl-terrace", "get"}}, []string{"get"}, ""},
		{"shell command", corev1.Container{Name: "c", Image: "terrace", Command: []string{"sh", "-c", "x"}}, nil, ReasonUnsupportedCommand},
		{"other image", corev1.Container{Name: "c", Image: "busybox", Command: []string{"terrace"}}, nil, ReasonUnsupportedImage},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := binaryArgs(&c.container, DefaultImages)
			if c.wantReason != "" {
				var u *unsupportedError
				if !errors.As(err, &u) || u.reason != c.wantReason {
					t.Fatalf("want %s, got %v", c.wantReason, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) == 0 && len(c.want) == 0 {
				return
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("got %q, want %q", got, c.want)
			}
		})
	}
}
