package runnerpolicy

import (
	"fmt"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

func secretVolume(name, secret string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: secret}}}
}

func projectedVolume(name string, sources ...corev1.VolumeProjection) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: sources}}}
}

func ref(name string) corev1.LocalObjectReference { return corev1.LocalObjectReference{Name: name} }

func secretAccess(name string) Access { return Access{Verb: "get", Resource: "secrets", Name: name} }
func configMapAccess(name string) Access {
	return Access{Verb: "get", Resource: "configmaps", Name: name}
}

// TestReferencesNameEveryObjectThePodWouldGet lists, for each way a pod
// spec names an object of the namespace, the review it needs and the field
// that named it.
func TestReferencesNameEveryObjectThePodWouldGet(t *testing.T) {
	claim := func(kind string, group *string, name string) *corev1.PersistentVolumeClaimTemplate {
		return &corev1.PersistentVolumeClaimTemplate{Spec: corev1.PersistentVolumeClaimSpec{
			DataSource: &corev1.TypedLocalObjectReference{APIGroup: group, Kind: kind, Name: name},
		}}
	}
	tests := []struct {
		name string
		tmpl terracev1.RunnerPodTemplate
		want []Reference
	}{
		{"a Secret volume", terracev1.RunnerPodTemplate{Volumes: []corev1.Volume{secretVolume("s", "victim")}},
			[]Reference{{secretAccess("victim"), []string{"spec.runner.volumes[0].secret.secretName"}}}},
		{"a ConfigMap volume", terracev1.RunnerPodTemplate{Volumes: []corev1.Volume{{Name: "c", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: ref("cm")}}}}},
			[]Reference{{configMapAccess("cm"), []string{"spec.runner.volumes[0].configMap.name"}}}},
		{"a claim", terracev1.RunnerPodTemplate{Volumes: []corev1.Volume{{Name: "p", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}}}},
			[]Reference{{Access{Verb: "get", Resource: "persistentvolumeclaims", Name: "data"}, []string{"spec.runner.volumes[0].persistentVolumeClaim.claimName"}}}},
		{"projected Secret, ConfigMap, foreign-audience token; the API server's token and downward API need nothing", terracev1.RunnerPodTemplate{Volumes: []corev1.Volume{projectedVolume("p",
			corev1.VolumeProjection{Secret: &corev1.SecretProjection{LocalObjectReference: ref("victim"), Optional: ptr.To(true)}},
			corev1.VolumeProjection{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: ref("cm")}},
			corev1.VolumeProjection{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Audience: "vault", Path: "t"}},
			corev1.VolumeProjection{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "k"}},
			corev1.VolumeProjection{DownwardAPI: &corev1.DownwardAPIProjection{}},
		)}}, []Reference{
			{secretAccess("victim"), []string{"spec.runner.volumes[0].projected.sources[0].secret.name"}},
			{configMapAccess("cm"), []string{"spec.runner.volumes[0].projected.sources[1].configMap.name"}},
			{Access{Verb: "create", Resource: "serviceaccounts", Subresource: "token", Name: "runner"}, []string{"spec.runner.volumes[0].projected.sources[2].serviceAccountToken"}},
		}},
		{"env and envFrom; one Secret named twice is one review", terracev1.RunnerPodTemplate{
			Env: []corev1.EnvVar{
				{Name: "PLAIN", Value: "x"},
				{Name: "POD", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
				{Name: "PW", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: ref("victim"), Key: "password"}}},
				{Name: "REGION", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: ref("cm"), Key: "region"}}},
			},
			EnvFrom: []corev1.EnvFromSource{
				{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: ref("victim")}},
				{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: ref("other")}},
			},
		}, []Reference{
			{secretAccess("victim"), []string{"spec.runner.env[2].valueFrom.secretKeyRef", "spec.runner.envFrom[0].secretRef"}},
			{configMapAccess("cm"), []string{"spec.runner.env[3].valueFrom.configMapKeyRef"}},
			{configMapAccess("other"), []string{"spec.runner.envFrom[1].configMapRef"}},
		}},
		{"a claim cloned from a claim or a snapshot", terracev1.RunnerPodTemplate{Volumes: []corev1.Volume{
			{Name: "a", VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{VolumeClaimTemplate: claim("PersistentVolumeClaim", nil, "state-of-others")}}},
			{Name: "b", VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{VolumeClaimTemplate: claim("VolumeSnapshot", ptr.To("snapshot.storage.k8s.io"), "snap")}}},
		}}, []Reference{
			{Access{Verb: "get", Resource: "persistentvolumeclaims", Name: "state-of-others"}, []string{"spec.runner.volumes[0].ephemeral.volumeClaimTemplate.spec.dataSource"}},
			{Access{Verb: "get", Group: "snapshot.storage.k8s.io", Resource: "volumesnapshots", Name: "snap"}, []string{"spec.runner.volumes[1].ephemeral.volumeClaimTemplate.spec.dataSource"}},
		}},
		{"Secrets given to volume drivers", terracev1.RunnerPodTemplate{Volumes: []corev1.Volume{
			{Name: "csi", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{Driver: "d", NodePublishSecretRef: &corev1.LocalObjectReference{Name: "csi-creds"}}}},
			{Name: "az", VolumeSource: corev1.VolumeSource{AzureFile: &corev1.AzureFileVolumeSource{SecretName: "az-creds", ShareName: "s"}}},
			{Name: "ceph", VolumeSource: corev1.VolumeSource{CephFS: &corev1.CephFSVolumeSource{Monitors: []string{"m"}, SecretRef: &corev1.LocalObjectReference{Name: "ceph-creds"}}}},
			{Name: "empty", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		}}, []Reference{
			{secretAccess("csi-creds"), []string{"spec.runner.volumes[0].csi.nodePublishSecretRef"}},
			{secretAccess("az-creds"), []string{"spec.runner.volumes[1].azureFile.secretName"}},
			{secretAccess("ceph-creds"), []string{"spec.runner.volumes[2].cephfs.secretRef"}},
		}},
		{"nothing named", terracev1.RunnerPodTemplate{Labels: map[string]string{"a": "b"}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := References(&tt.tmpl, "runner")
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
	if got := References(nil, "runner"); got != nil {
		t.Errorf("no template: %+v", got)
	}
}

func TestAccessNames(t *testing.T) {
	for a, want := range map[Access][2]string{
		secretAccess("x"): {"Secret", "secrets"},
		{Verb: "create", Resource: "serviceaccounts", Subresource: "token", Name: "r"}:          {"a token of ServiceAccount", "serviceaccounts/token"},
		{Verb: "get", Group: "snapshot.storage.k8s.io", Resource: "volumesnapshots", Name: "s"}: {"VolumeSnapshot", "volumesnapshots.snapshot.storage.k8s.io"},
	} {
		if got := [2]string{a.Kind(), a.ResourceName()}; got != want {
			t.Errorf("%+v: %q, want %q", a, got, want)
		}
	}
}

// TestReferencesAreBounded: a spec.runner naming more objects than the
// controller reviews is refused as a whole.
func TestReferencesAreBounded(t *testing.T) {
	p, _ := Resolve(floorOf(nil), nil, defaultImage)
	var vols []corev1.Volume
	for i := range MaxReferences + 1 {
		vols = append(vols, secretVolume(fmt.Sprint("v", i), fmt.Sprint("s", i)))
	}
	err := p.Check(pod(func(p *Pod) { p.Template = &terracev1.RunnerPodTemplate{Volumes: vols} }))
	if v, ok := err.(Violations); !ok || len(v) != 1 || v[0].Field != "spec.runner" {
		t.Fatalf("err = %v", err)
	}
	if err := p.Check(pod(func(p *Pod) { p.Template = &terracev1.RunnerPodTemplate{Volumes: vols[:MaxReferences]} })); err != nil {
		t.Fatalf("%d references refused: %v", MaxReferences, err)
	}
}
