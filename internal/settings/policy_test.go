package settings

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/runnerpolicy"
)

// TestRunnerPolicyThroughConfigs resolves Stacks against an operator floor
// and a namespace config that tries to widen it, and checks which runner
// pods are refused, naming which field.
func TestRunnerPolicyThroughConfigs(t *testing.T) {
	floor := &terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{
		Image:  "registry.example/terrace:v1",
		Policy: &terracev1.RunnerPolicy{AllowPlacement: ptr(false), DeniedServiceAccounts: []string{"cluster-admin-sa"}},
	}}
	ns := &terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{
		Policy: &terracev1.RunnerPolicy{AllowedImages: []string{"**"}, AllowPlacement: ptr(true), AllowEnv: ptr(false)},
	}}
	r := resolver(namespaceAndOperatorConfigs(ns, floor)...)
	for _, tc := range []struct {
		name   string
		stack  terracev1.StackSpec
		fields []string
	}{
		{name: "nothing set: the floor's image", fields: nil},
		{name: "the floor's image named explicitly", stack: terracev1.StackSpec{Runner: &terracev1.RunnerPodTemplate{Image: "registry.example/terrace:v1"}}},
		{name: "another image, though the namespace allows **", stack: terracev1.StackSpec{Runner: &terracev1.RunnerPodTemplate{Image: "evil/image"}}, fields: []string{"spec.runner.image"}},
		{name: "the controller's account", stack: terracev1.StackSpec{ServiceAccountName: "terrace-controller"}, fields: []string{"spec.serviceAccountName"}},
		{name: "an account the floor denies", stack: terracev1.StackSpec{ServiceAccountName: "cluster-admin-sa"}, fields: []string{"spec.serviceAccountName"}},
		{name: "an account no config lists", stack: terracev1.StackSpec{ServiceAccountName: "deployer"}, fields: []string{"spec.serviceAccountName"}},
		{name: "the default account named explicitly", stack: terracev1.StackSpec{ServiceAccountName: "default"}},
		{name: "placement, though the namespace allows it", stack: terracev1.StackSpec{Runner: &terracev1.RunnerPodTemplate{Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}}}}, fields: []string{"spec.runner.tolerations"}},
		{name: "envFrom, which the namespace forbids", stack: terracev1.StackSpec{Runner: &terracev1.RunnerPodTemplate{EnvFrom: []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "victim"}}}}}}, fields: []string{"spec.runner.envFrom[0].secretRef"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := stack(tc.stack)
			eff, err := r.Resolve(context.Background(), st)
			if err != nil {
				t.Fatal(err)
			}
			err = eff.CheckRunner(st)
			var v runnerpolicy.Violations
			if tc.fields == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.As(err, &v) || !slices.Equal(v.Fields(), tc.fields) {
				t.Fatalf("err = %v, want violations of %q", err, tc.fields)
			}
		})
	}
	eff, err := r.ResolveNamespace(context.Background(), teamNS)
	if err != nil {
		t.Fatal(err)
	}
	var notes []string
	for _, n := range eff.RunnerPolicyNotes {
		notes = append(notes, n.Source+": "+n.Message)
	}
	if len(notes) != 2 || !strings.Contains(notes[0], `team-a/default: allowedImages: "**"`) || !strings.Contains(notes[1], "team-a/default: allowPlacement: true is ignored") {
		t.Fatalf("notes %q", notes)
	}
}

// TestNamespaceConfigImageIsHeldToTheFloor: a namespace config naming its
// own runner image gets it only if the floor allows it, and the violation
// names the config's field.
func TestNamespaceConfigImageIsHeldToTheFloor(t *testing.T) {
	ns := &terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{Image: "evil/image", ServiceAccountName: "terrace-api"}}
	eff, err := resolver(namespaceAndOperatorConfigs(ns, nil)...).Resolve(context.Background(), stack(terracev1.StackSpec{}))
	if err != nil {
		t.Fatal(err)
	}
	var v runnerpolicy.Violations
	want := []string{"spec.runner.image of TerraceConfig team-a/default", "spec.runner.serviceAccountName of TerraceConfig team-a/default"}
	if err := eff.CheckConfigRunner(); !errors.As(err, &v) || !slices.Equal(v.Fields(), want) {
		t.Fatalf("err = %v, want violations of %q", err, want)
	}
	// The floor may allow it.
	floor := &terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{Policy: &terracev1.RunnerPolicy{AllowedImages: []string{"evil/*"}}}}
	ns.Runner.ServiceAccountName = ""
	eff, err = resolver(namespaceAndOperatorConfigs(ns, floor)...).Resolve(context.Background(), stack(terracev1.StackSpec{}))
	if err != nil {
		t.Fatal(err)
	}
	if err := eff.CheckConfigRunner(); err != nil {
		t.Fatalf("an image the floor allows is refused: %v", err)
	}
}

// TestRunnerServiceAccountDefaultsToTheConfigs: when no config lists
// allowedServiceAccounts, a Stack may run only as the account the configs
// name for runners (the namespace's first), whatever its
// spec.serviceAccountName says.
func TestRunnerServiceAccountDefaultsToTheConfigs(t *testing.T) {
	floor := &terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{ServiceAccountName: "terrace-runner"}}
	ns := &terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{ServiceAccountName: "team-runner"}}
	for _, tc := range []struct {
		name             string
		ns               *terracev1.TerraceConfigSpec
		allowed, refused []string
	}{
		{name: "the floor config's account", allowed: []string{"", "terrace-runner"}, refused: []string{"default", "team-runner"}},
		{name: "the namespace config's account", ns: ns, allowed: []string{"", "team-runner"}, refused: []string{"default", "terrace-runner"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := resolver(namespaceAndOperatorConfigs(tc.ns, floor)...)
			check := func(sa string) error {
				st := stack(terracev1.StackSpec{ServiceAccountName: sa})
				eff, err := r.Resolve(context.Background(), st)
				if err != nil {
					t.Fatal(err)
				}
				return eff.CheckRunner(st)
			}
			for _, sa := range tc.allowed {
				if err := check(sa); err != nil {
					t.Errorf("%q refused: %v", sa, err)
				}
			}
			for _, sa := range tc.refused {
				var v runnerpolicy.Violations
				if err := check(sa); !errors.As(err, &v) || !slices.Equal(v.Fields(), []string{"spec.serviceAccountName"}) {
					t.Errorf("%q: err = %v, want a violation of spec.serviceAccountName", sa, err)
				}
			}
		})
	}
}

// TestPolicyChangesTheHash: a policy change must re-reconcile the Stacks it governs.
func TestPolicyChangesTheHash(t *testing.T) {
	a, _ := resolver().ResolveNamespace(context.Background(), teamNS)
	b, _ := resolver(tcfg(opNS, terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{Policy: &terracev1.RunnerPolicy{AllowEnv: ptr(false)}}})).ResolveNamespace(context.Background(), teamNS)
	if a.Hash() == b.Hash() {
		t.Fatal("a stricter policy left the hash unchanged")
	}
}
