package runnerpolicy

import (
	"errors"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

const defaultImage = "ghcr.io/terrace-dev/terrace:v1"

func floorOf(p *terracev1.RunnerPolicy) Layer {
	return Layer{Source: "terrace-system/default", Spec: p}
}
func nsOf(p *terracev1.RunnerPolicy) *Layer { return &Layer{Source: "team/default", Spec: p} }

// pod is a runner pod that every default policy allows.
func pod(change func(*Pod)) Pod {
	p := Pod{
		Template:           &terracev1.RunnerPodTemplate{},
		Image:              defaultImage,
		ImageField:         "the controller's default runner image",
		ServiceAccountName: "default", ServiceAccountField: "the default ServiceAccount",
	}
	if change != nil {
		change(&p)
	}
	return p
}

func TestResolveFloorAndNarrowing(t *testing.T) {
	tests := []struct {
		name  string
		floor *terracev1.RunnerPolicy
		ns    *terracev1.RunnerPolicy
		// allowed and refused are images checked against the result.
		allowed, refused []string
		notes            []string
	}{
		{name: "built-in: only the default image", allowed: []string{defaultImage}, refused: []string{"ghcr.io/terrace-dev/terrace:v2", "evil/image"}},
		{
			name:    "floor patterns",
			floor:   &terracev1.RunnerPolicy{AllowedImages: []string{"ghcr.io/acme/*"}},
			allowed: []string{"ghcr.io/acme/runner:v1", "ghcr.io/acme/runner@sha256:" + strings.Repeat("a", 64)},
			refused: []string{defaultImage, "ghcr.io/acme/sub/runner:v1", "ghcr.io/acmex/runner"},
		},
		{
			name:    "namespace narrows",
			floor:   &terracev1.RunnerPolicy{AllowedImages: []string{"ghcr.io/acme/*"}},
			ns:      &terracev1.RunnerPolicy{AllowedImages: []string{"ghcr.io/acme/runner:*"}},
			allowed: []string{"ghcr.io/acme/runner:v1"},
			refused: []string{"ghcr.io/acme/other:v1"},
		},
		{
			name:    "namespace tries to widen: reported, and only the intersection is allowed",
			floor:   &terracev1.RunnerPolicy{AllowedImages: []string{"ghcr.io/acme/*"}},
			ns:      &terracev1.RunnerPolicy{AllowedImages: []string{"**", "ghcr.io/acme/runner:*"}},
			allowed: []string{"ghcr.io/acme/runner:v1", "ghcr.io/acme/other:v1"},
			refused: []string{"evil/image", "docker.io/evil/image:latest"},
			notes:   []string{`team/default: allowedImages: "**" is not within terrace-system/default`},
		},
		{
			name:    "namespace widens the built-in default: refused",
			ns:      &terracev1.RunnerPolicy{AllowedImages: []string{"evil/*"}},
			refused: []string{"evil/image", defaultImage},
			notes:   []string{`team/default: allowedImages: "evil/*" is not within the built-in runner policy`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ns *Layer
			if tt.ns != nil {
				ns = nsOf(tt.ns)
			}
			p, notes := Resolve(floorOf(tt.floor), ns, defaultImage)
			for _, img := range tt.allowed {
				if err := p.Check(pod(func(p *Pod) { p.Image = img })); err != nil {
					t.Errorf("%s refused: %v", img, err)
				}
			}
			for _, img := range tt.refused {
				err := p.Check(pod(func(p *Pod) { p.Image, p.ImageField = img, "spec.runner.image" }))
				var v Violations
				if !errors.As(err, &v) || !slices.Equal(v.Fields(), []string{"spec.runner.image"}) {
					t.Errorf("%s: want a violation of spec.runner.image, got %v", img, err)
				}
			}
			expectNotes(t, notes, tt.notes)
		})
	}
}

func expectNotes(t *testing.T, notes []Note, want []string) {
	t.Helper()
	var got []string
	for _, n := range notes {
		got = append(got, n.Source+": "+n.Message)
	}
	if len(got) != len(want) {
		t.Fatalf("notes %q, want %d like %q", got, len(want), want)
	}
	for i := range want {
		if !strings.Contains(got[i], want[i]) {
			t.Errorf("note %q does not contain %q", got[i], want[i])
		}
	}
}

func TestNamespaceCannotWidenRulesOrVolumeTypes(t *testing.T) {
	floor := &terracev1.RunnerPolicy{
		AllowEnv: ptr.To(false), AllowPlacement: ptr.To(false),
		AllowedVolumeTypes:     []terracev1.VolumeType{"configMap", "emptyDir"},
		AllowedServiceAccounts: []string{"runner-*"},
		DeniedServiceAccounts:  []string{"runner-admin"},
	}
	ns := &terracev1.RunnerPolicy{
		AllowEnv: ptr.To(true), AllowPlacement: ptr.To(true),
		AllowedVolumeTypes:     []terracev1.VolumeType{"emptyDir", "secret", "hostPath"},
		AllowedServiceAccounts: []string{"*"},
	}
	p, notes := Resolve(floorOf(floor), nsOf(ns), defaultImage)
	if p.Env.Allowed || p.Placement.Allowed || !slices.Equal(p.VolumeTypes, []string{"emptyDir"}) {
		t.Fatalf("a namespace widened the floor: %+v", p)
	}
	expectNotes(t, notes, []string{
		`allowedServiceAccounts: "*" is not within terrace-system/default`,
		"allowedVolumeTypes: secret is not allowed by terrace-system/default",
		"allowedVolumeTypes: hostPath is never allowed",
		"allowEnv: true is ignored: terrace-system/default does not allow it",
		"allowPlacement: true is ignored",
	})
	for sa, ok := range map[string]bool{"runner-a": true, "default": false, "runner-admin": false, "terrace-api": false} {
		err := p.Check(pod(func(p *Pod) { p.ServiceAccountName, p.ServiceAccountField = sa, "spec.serviceAccountName" }))
		if (err == nil) != ok {
			t.Errorf("ServiceAccount %s: allowed=%v, want %v (%v)", sa, err == nil, ok, err)
		}
	}
}

func TestNamespaceNarrowsRules(t *testing.T) {
	p, notes := Resolve(floorOf(nil), nsOf(&terracev1.RunnerPolicy{
		AllowEnv: ptr.To(false), AllowPlacement: ptr.To(false),
		AllowedVolumeTypes:    []terracev1.VolumeType{"configMap"},
		DeniedServiceAccounts: []string{"deployer"},
	}), defaultImage)
	expectNotes(t, notes, nil)
	if p.Env.Allowed || p.Env.DeniedBy != "team/default" || p.Placement.Allowed || !slices.Equal(p.VolumeTypes, []string{"configMap"}) ||
		!slices.Contains(p.DeniedServiceAccounts, "deployer") {
		t.Fatalf("narrowing lost: %+v", p)
	}
}

func TestFloorHostPathIsDropped(t *testing.T) {
	p, notes := Resolve(floorOf(&terracev1.RunnerPolicy{AllowedVolumeTypes: []terracev1.VolumeType{"hostPath", "emptyDir"}}), nil, defaultImage)
	if slices.Contains(p.VolumeTypes, "hostPath") {
		t.Fatal("hostPath allowed")
	}
	expectNotes(t, notes, []string{"terrace-system/default: allowedVolumeTypes: hostPath is never allowed"})
}

// TestViolations tries each thing a hostile Stack could ask for and
// expects the field it used to be named.
func TestViolations(t *testing.T) {
	strict, _ := Resolve(floorOf(nil), nsOf(&terracev1.RunnerPolicy{AllowEnv: ptr.To(false), AllowPlacement: ptr.To(false)}), defaultImage)
	loose, _ := Resolve(floorOf(&terracev1.RunnerPolicy{AllowedImages: []string{"**"}, AllowedVolumeTypes: []terracev1.VolumeType{"hostPath", "emptyDir", "secret", "nfs"}}), nil, defaultImage)
	tmpl := func(t terracev1.RunnerPodTemplate) func(*Pod) { return func(p *Pod) { p.Template = &t } }
	tests := []struct {
		name   string
		policy Policy
		pod    Pod
		fields []string
		reason string
	}{
		{"hostPath, even when a config lists it", loose, pod(tmpl(terracev1.RunnerPodTemplate{Volumes: []corev1.Volume{
			{Name: "ok", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			{Name: "root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}},
		}})), []string{"spec.runner.volumes[1].hostPath"}, "never allowed"},
		{"a volume type outside the default", strict, pod(tmpl(terracev1.RunnerPodTemplate{Volumes: []corev1.Volume{
			{Name: "n", VolumeSource: corev1.VolumeSource{NFS: &corev1.NFSVolumeSource{Server: "10.0.0.1", Path: "/"}}},
		}})), []string{"spec.runner.volumes[0].nfs"}, "volume type nfs is not allowed by the built-in runner policy"},
		{"an image outside the patterns", strict, pod(func(p *Pod) { p.Image, p.ImageField = "evil/image", "spec.runner.image" }),
			[]string{"spec.runner.image"}, `image "evil/image" is not allowed`},
		{"a namespace config's own image", strict, pod(func(p *Pod) { p.Image, p.ImageField = "evil/image", "spec.runner.image of TerraceConfig team/default" }),
			[]string{"spec.runner.image of TerraceConfig team/default"}, "not allowed"},
		{"a malformed image", loose, pod(func(p *Pod) { p.Image, p.ImageField = "UPPER/Case::", "spec.runner.image" }),
			[]string{"spec.runner.image"}, "not a valid image reference"},
		{"the API server's account", loose, pod(func(p *Pod) { p.ServiceAccountName, p.ServiceAccountField = "terrace-api", "spec.serviceAccountName" }),
			[]string{"spec.serviceAccountName"}, "one of Terrace's own"},
		{"the controller's account, from a config", loose, pod(func(p *Pod) {
			p.ServiceAccountName, p.ServiceAccountField = "terrace-controller", "spec.runner.serviceAccountName of TerraceConfig team/default"
		}), []string{"spec.runner.serviceAccountName of TerraceConfig team/default"}, "one of Terrace's own"},
		{"env and envFrom when env is not allowed", strict, pod(tmpl(terracev1.RunnerPodTemplate{
			Env: []corev1.EnvVar{{Name: "A", Value: "b"}},
			EnvFrom: []corev1.EnvFromSource{
				{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "c"}}},
				{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "victim"}}},
			},
		})), []string{"spec.runner.env", "spec.runner.envFrom[0].configMapRef", "spec.runner.envFrom[1].secretRef"}, "team/default sets allowEnv: false"},
		{"placement when it is not allowed", strict, pod(tmpl(terracev1.RunnerPodTemplate{
			NodeSelector: map[string]string{"node-role.kubernetes.io/control-plane": ""},
			Tolerations:  []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Affinity:     &corev1.Affinity{},
		})), []string{"spec.runner.nodeSelector", "spec.runner.tolerations", "spec.runner.affinity"}, "allowPlacement: false"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.policy.Check(tt.pod)
			var v Violations
			if !errors.As(err, &v) {
				t.Fatalf("allowed: %v", err)
			}
			if !slices.Equal(v.Fields(), tt.fields) {
				t.Errorf("fields %q, want %q", v.Fields(), tt.fields)
			}
			if !strings.Contains(err.Error(), tt.reason) {
				t.Errorf("%q does not say %q", err, tt.reason)
			}
		})
	}
	// The same pods with nothing hostile pass.
	if err := strict.Check(pod(nil)); err != nil {
		t.Fatalf("the default pod is refused: %v", err)
	}
	if err := loose.Check(pod(tmpl(terracev1.RunnerPodTemplate{Env: []corev1.EnvVar{{Name: "A"}}, NodeSelector: map[string]string{"a": "b"},
		Volumes: []corev1.Volume{{Name: "s", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "x"}}}}}))); err != nil {
		t.Fatalf("an allowed pod is refused: %v", err)
	}
}

func TestMinimalHoldsTheHardRules(t *testing.T) {
	m := Minimal()
	if err := m.Check(pod(func(p *Pod) { p.Image = "anything/at:all" })); err != nil {
		t.Fatalf("minimal refuses an image: %v", err)
	}
	err := m.Check(pod(func(p *Pod) {
		p.ServiceAccountName = "terrace-api"
		p.Template = &terracev1.RunnerPodTemplate{Volumes: []corev1.Volume{{Name: "h", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}}}
	}))
	var v Violations
	if !errors.As(err, &v) || len(v) != 2 {
		t.Fatalf("minimal allows hostPath or terrace-api: %v", err)
	}
}

func TestPatterns(t *testing.T) {
	for _, tt := range []struct {
		pattern, name string
		match         bool
	}{
		{"ghcr.io/acme/*", "ghcr.io/acme/runner:v1", true},
		{"ghcr.io/acme/*", "ghcr.io/acme/team/runner:v1", false},
		{"ghcr.io/acme/**", "ghcr.io/acme/team/runner:v1", true},
		{"ghcr.io/acme/*", "ghcr.io/acmeXrunner", false},
		{"ghcr.io/acme/runner:v?", "ghcr.io/acme/runner:v1", true},
		{"ghcr.io/acme/runner:v?", "ghcr.io/acme/runner:v12", false},
		{"ghcr.io/acme/runner", "ghcr.io/acme/runner:v1", false},
		{"runner.*", "runnerX", false}, // '.' is literal
		{"runner-*", "runner-a", true},
		{"**", "anything/at/all:v1", true},
		{"[a]", "a", false}, // no character classes
	} {
		if got := matchAny([]string{tt.pattern}, tt.name); got != tt.match {
			t.Errorf("%q matches %q: %v, want %v", tt.pattern, tt.name, got, tt.match)
		}
	}
}

// allowOwnBackend narrows like the other rules: a namespace may forbid what
// the floor allows, never allow what it forbids, and Check names spec.backend.
func TestOwnBackendRule(t *testing.T) {
	p, notes := Resolve(floorOf(nil), nsOf(&terracev1.RunnerPolicy{AllowOwnBackend: ptr.To(false)}), defaultImage)
	expectNotes(t, notes, nil)
	pod := Pod{Image: defaultImage, ServiceAccountName: "default", OwnBackend: "s3"}
	var v Violations
	if err := p.Check(pod); !errors.As(err, &v) || !slices.Equal(v.Fields(), []string{"spec.backend"}) || !strings.Contains(err.Error(), "team/default sets allowOwnBackend: false") {
		t.Fatalf("err = %v", err)
	}
	p, notes = Resolve(floorOf(&terracev1.RunnerPolicy{AllowOwnBackend: ptr.To(false)}), nsOf(&terracev1.RunnerPolicy{AllowOwnBackend: ptr.To(true)}), defaultImage)
	if p.OwnBackend.Allowed || len(notes) != 1 || !strings.Contains(notes[0].Message, "allowOwnBackend: true is ignored") {
		t.Fatalf("a namespace widened the floor: %+v %+v", p.OwnBackend, notes)
	}
	if err := Minimal().Check(pod); err != nil {
		t.Fatalf("the minimal policy refuses an own backend: %v", err)
	}
	pod.OwnBackend = ""
	if err := p.Check(pod); err != nil {
		t.Fatalf("a Stack without spec.backend is refused: %v", err)
	}
}
