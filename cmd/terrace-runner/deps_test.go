package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestTheRunnerLinksNoKubernetesClient keeps the runner's start small: the
// Kubernetes API packages' initialisation was two thirds of its start-up
// CPU, and a runner process starts for every run. The controller-side parts
// of the packages it shares live apart (internal/pki/casecret,
// internal/artifact/artifactserver, the phase histogram in the Stack
// controller).
func TestTheRunnerLinksNoKubernetesClient(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		var stderr []byte
		if exit, ok := err.(*exec.ExitError); ok {
			stderr = exit.Stderr
		}
		t.Fatalf("go list: %v\n%s", err, stderr)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{"k8s.io/", "sigs.k8s.io/", "github.com/prometheus/"} {
			if strings.HasPrefix(dep, banned) {
				t.Errorf("terrace-runner links %s", dep)
			}
		}
	}
}
