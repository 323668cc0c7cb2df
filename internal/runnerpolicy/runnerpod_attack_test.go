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

// TestRunnerPodMetadataAttacks is issue 44 item 2 as the attack, under the
// default policy: a Stack author labels and annotates the runner pod to
// pass for another Stack's run or a warm pod (terrace.dev/*), to join the
// Installations API's Service (app.kubernetes.io/name), or to leave its
// confinement (AppArmor unconfined, seccomp, a runtime's or Multus'
// annotations). Each key is refused, by name.
func TestRunnerPodMetadataAttacks(t *testing.T) {
	p, _ := Resolve(floorOf(nil), nil, defaultImage)
	tests := []struct {
		name        string
		labels      map[string]string
		annotations map[string]string
		field       string
		reason      string
	}{
		{"another Stack's run", map[string]string{"terrace.dev/stack": "prod-db"}, nil, "spec.runner.labels[terrace.dev/stack]", "Terrace's own"},
		{"a warm pod of a class", map[string]string{"terrace.dev/warm-class": "c1"}, nil, "spec.runner.labels[terrace.dev/warm-class]", "Terrace's own"},
		{"a subdomain of terrace.dev", map[string]string{"x.terrace.dev/a": "b"}, nil, "spec.runner.labels[x.terrace.dev/a]", "Terrace's own"},
		{"the Installations API's Service selector", map[string]string{"app.kubernetes.io/name": "terrace-api"}, nil, "spec.runner.labels[app.kubernetes.io/name]", "Kubernetes itself"},
		{"a pod Cleanup leaves alone", nil, map[string]string{"terrace.dev/retained": "true"}, "spec.runner.annotations[terrace.dev/retained]", "Terrace's own"},
		{"AppArmor unconfined", nil, map[string]string{"container.apparmor.security.beta.kubernetes.io/runner": "unconfined"},
			"spec.runner.annotations[container.apparmor.security.beta.kubernetes.io/runner]", "AppArmor"},
		{"seccomp unconfined", nil, map[string]string{"seccomp.security.alpha.kubernetes.io/pod": "unconfined"},
			"spec.runner.annotations[seccomp.security.alpha.kubernetes.io/pod]", "seccomp"},
		{"a container seccomp profile", nil, map[string]string{"container.seccomp.security.alpha.kubernetes.io/runner": "unconfined"},
			"spec.runner.annotations[container.seccomp.security.alpha.kubernetes.io/runner]", "seccomp"},
		{"a runtime's user namespace setting", nil, map[string]string{"io.kubernetes.cri-o.userns-mode": "host"},
			"spec.runner.annotations[io.kubernetes.cri-o.userns-mode]", "container runtimes"},
		{"another network", nil, map[string]string{"k8s.v1.cni.cncf.io/networks": "host-net"},
			"spec.runner.annotations[k8s.v1.cni.cncf.io/networks]", "another network"},
		{"out of the mesh", map[string]string{"sidecar.istio.io/inject": "false"}, nil, "spec.runner.labels[sidecar.istio.io/inject]", "service mesh"},
		{"case does not hide a domain", map[string]string{"Terrace.Dev/run": "r1"}, nil, "spec.runner.labels[Terrace.Dev/run]", "Terrace's own"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := p.Check(pod(func(p *Pod) {
				p.Template = &terracev1.RunnerPodTemplate{Labels: tt.labels, Annotations: tt.annotations}
			}))
			var v Violations
			if !errors.As(err, &v) || !slices.Equal(v.Fields(), []string{tt.field}) {
				t.Fatalf("err = %v, want a violation of %s", err, tt.field)
			}
			if !strings.Contains(err.Error(), tt.reason) {
				t.Errorf("%q does not say %q", err, tt.reason)
			}
		})
	}
	// Keys of the Stack author's own, and the harmless Kubernetes ones, pass.
	err := p.Check(pod(func(p *Pod) {
		p.Template = &terracev1.RunnerPodTemplate{
			Labels: map[string]string{"team": "payments", "example.com/cost-center": "42", "notterrace.dev/x": "y"},
			Annotations: map[string]string{"example.com/owner": "a@example.com", "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
				"kubectl.kubernetes.io/default-container": "runner", "io.example/x": "y"},
		}
	}))
	if err != nil {
		t.Fatalf("ordinary labels and annotations are refused: %v", err)
	}
	// The hard rules hold without any policy too (the launcher's check).
	if err := Minimal().Check(pod(func(p *Pod) {
		p.Template = &terracev1.RunnerPodTemplate{Annotations: map[string]string{"container.apparmor.security.beta.kubernetes.io/runner": "unconfined"}}
	})); err == nil {
		t.Fatal("the minimal policy allows an unconfined AppArmor profile")
	}
}

// TestForeignServiceAccountAttack: a Stack author names another
// ServiceAccount of the namespace (one an admin bound to more rights) in
// spec.serviceAccountName. No config lists it, so it is refused; the
// namespace's default runner account, from whichever config names it,
// is allowed; an account a config lists is allowed.
func TestForeignServiceAccountAttack(t *testing.T) {
	tests := []struct {
		name             string
		floor, ns        *Layer
		allowed, refused []string
	}{
		{name: "nothing configured: only default", floor: floorOf(nil).ptr(), allowed: []string{"default"}, refused: []string{"deployer", "namespace-admin"}},
		{name: "the floor config's runner account", floor: &Layer{Source: "terrace-system/default", ServiceAccountName: "terrace-runner"},
			allowed: []string{"terrace-runner"}, refused: []string{"default", "deployer"}},
		{name: "the namespace config's runner account wins", floor: &Layer{Source: "terrace-system/default", ServiceAccountName: "terrace-runner"},
			ns: &Layer{Source: "team/default", ServiceAccountName: "team-runner"}, allowed: []string{"team-runner"}, refused: []string{"terrace-runner", "default"}},
		{name: "the namespace lists accounts (the floor lists none)", floor: floorOf(nil).ptr(),
			ns: nsOf(&terracev1.RunnerPolicy{AllowedServiceAccounts: []string{"default", "ci-*"}}), allowed: []string{"default", "ci-deploy"}, refused: []string{"deployer"}},
		{name: "the floor lists accounts: the namespace only narrows", floor: floorOf(&terracev1.RunnerPolicy{AllowedServiceAccounts: []string{"runner-*"}}).ptr(),
			ns: nsOf(&terracev1.RunnerPolicy{AllowedServiceAccounts: []string{"runner-a", "deployer"}}), allowed: []string{"runner-a"}, refused: []string{"runner-b", "deployer", "default"}},
		{name: "the floor allows any: still never Terrace's own", floor: floorOf(&terracev1.RunnerPolicy{AllowedServiceAccounts: []string{"*"}}).ptr(),
			allowed: []string{"deployer", "default"}, refused: []string{"terrace-api", "terrace-controller"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, _ := Resolve(*tt.floor, tt.ns, defaultImage)
			for _, sa := range tt.allowed {
				if err := p.Check(pod(func(p *Pod) { p.ServiceAccountName, p.ServiceAccountField = sa, "spec.serviceAccountName" })); err != nil {
					t.Errorf("%s refused: %v", sa, err)
				}
			}
			for _, sa := range tt.refused {
				err := p.Check(pod(func(p *Pod) { p.ServiceAccountName, p.ServiceAccountField = sa, "spec.serviceAccountName" }))
				var v Violations
				if !errors.As(err, &v) || !slices.Equal(v.Fields(), []string{"spec.serviceAccountName"}) {
					t.Errorf("%s: err = %v, want a violation of spec.serviceAccountName", sa, err)
				}
			}
		})
	}
	p, _ := Resolve(floorOf(nil), nil, defaultImage)
	err := p.Check(pod(func(p *Pod) { p.ServiceAccountName, p.ServiceAccountField = "deployer", "spec.serviceAccountName" }))
	if err == nil || !strings.Contains(err.Error(), "only the namespace's default runner ServiceAccount") || !strings.Contains(err.Error(), "allowedServiceAccounts: default") {
		t.Errorf("the message does not say what is allowed: %v", err)
	}
}

func (l Layer) ptr() *Layer { return &l }

// TestAllowEnvFalseCoversSecretVolumes: with allowEnv: false a Stack
// author cannot get a Secret to module code through a file instead of an
// environment variable: secret volumes, projected Secrets and tokens for
// another audience are refused; ConfigMaps, the downward API and the API
// server's own token are not.
func TestAllowEnvFalseCoversSecretVolumes(t *testing.T) {
	p, _ := Resolve(floorOf(nil), nsOf(&terracev1.RunnerPolicy{AllowEnv: ptr.To(false)}), defaultImage)
	err := p.Check(pod(func(p *Pod) {
		p.Template = &terracev1.RunnerPodTemplate{Volumes: []corev1.Volume{
			secretVolume("s", "victim"),
			projectedVolume("p",
				corev1.VolumeProjection{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: ref("cm")}},
				corev1.VolumeProjection{Secret: &corev1.SecretProjection{LocalObjectReference: ref("victim")}},
				corev1.VolumeProjection{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Audience: "vault", Path: "t"}},
			),
		}}
	}))
	want := []string{"spec.runner.volumes[0].secret", "spec.runner.volumes[1].projected.sources[1].secret", "spec.runner.volumes[1].projected.sources[2].serviceAccountToken"}
	var v Violations
	if !errors.As(err, &v) || !slices.Equal(v.Fields(), want) || !strings.Contains(err.Error(), "team/default sets allowEnv: false") {
		t.Fatalf("err = %v, want violations of %q", err, want)
	}
	err = p.Check(pod(func(p *Pod) {
		p.Template = &terracev1.RunnerPodTemplate{Volumes: []corev1.Volume{
			{Name: "c", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: ref("cm")}}},
			projectedVolume("p",
				corev1.VolumeProjection{DownwardAPI: &corev1.DownwardAPIProjection{}},
				corev1.VolumeProjection{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}},
			),
		}}
	}))
	if err != nil {
		t.Fatalf("volumes without Secrets are refused: %v", err)
	}
}

// TestClaimDataSourcesTheReviewCannotCover: a claim cloned from an object
// RBAC cannot name for the runner, or from another namespace, is refused.
func TestClaimDataSourcesTheReviewCannotCover(t *testing.T) {
	p, _ := Resolve(floorOf(nil), nil, defaultImage)
	ephemeral := func(ds *corev1.TypedObjectReference) corev1.Volume {
		return corev1.Volume{Name: "e", VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{
			VolumeClaimTemplate: &corev1.PersistentVolumeClaimTemplate{Spec: corev1.PersistentVolumeClaimSpec{DataSourceRef: ds}},
		}}}
	}
	for ds, field := range map[*corev1.TypedObjectReference]string{
		{Kind: "PersistentVolumeClaim", Name: "db", Namespace: ptr.To("other-team")}:     "spec.runner.volumes[0].ephemeral.volumeClaimTemplate.spec.dataSourceRef.namespace",
		{APIGroup: ptr.To("populator.example.com"), Kind: "Populator", Name: "anything"}: "spec.runner.volumes[0].ephemeral.volumeClaimTemplate.spec.dataSourceRef",
	} {
		err := p.Check(pod(func(p *Pod) { p.Template = &terracev1.RunnerPodTemplate{Volumes: []corev1.Volume{ephemeral(ds)}} }))
		var v Violations
		if !errors.As(err, &v) || !slices.Equal(v.Fields(), []string{field}) {
			t.Errorf("%+v: err = %v, want a violation of %s", ds, err, field)
		}
	}
	if err := p.Check(pod(func(p *Pod) {
		p.Template = &terracev1.RunnerPodTemplate{Volumes: []corev1.Volume{ephemeral(&corev1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: "db"})}}
	})); err != nil {
		t.Fatalf("a claim cloned from one of the namespace is refused (its review is the controller's): %v", err)
	}
}
