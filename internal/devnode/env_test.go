package devnode

import (
	"context"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

func testObjects() *fake.Clientset {
	return fake.NewClientset(
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "creds", Namespace: "ns"}, Data: map[string][]byte{"password": []byte("s3cret"), "user": []byte("admin")}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings", Namespace: "ns"}, Data: map[string]string{"level": "debug", "region": "eu"}},
	)
}

func testPod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "runner-1", Namespace: "ns", UID: "uid-1", Labels: map[string]string{"app": "x"}},
		Spec:       corev1.PodSpec{ServiceAccountName: "stack-sa", NodeName: "devnode"},
	}
}

func TestResolveEnv(t *testing.T) {
	c := &corev1.Container{
		Name: "main",
		EnvFrom: []corev1.EnvFromSource{
			{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}, Prefix: "CFG_"},
			{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}}},
		},
		Env: []corev1.EnvVar{
			{Name: "PLAIN", Value: "v"},
			{Name: "PASS", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}, Key: "password"}}},
			{Name: "LEVEL", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}, Key: "level"}}},
			{Name: "NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
			{Name: "NS", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
			{Name: "IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
			{Name: "SA", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.serviceAccountName"}}},
			{Name: "APP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['app']"}}},
			{Name: "ADDR", Value: "$(IP):9090"},
			{Name: "ESCAPED", Value: "$$(IP) $(UNKNOWN)"},
			{Name: "MISSING_OK", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "nope"}, Key: "k", Optional: ptr.To(true)}}},
			{Name: "POD_IP", Value: "overridden"},
		},
	}
	vars, err := resolveEnv(context.Background(), newObjectSource(testObjects(), "ns"), testPod(), c, "127.0.0.7", []envVar{{"POD_IP", "127.0.0.7"}, {"BASE", "b"}})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	order := []string{}
	for _, v := range vars {
		got[v.name] = v.value
		order = append(order, v.name)
	}
	want := map[string]string{
		"BASE": "b", "CFG_level": "debug", "CFG_region": "eu", "password": "s3cret", "user": "admin",
		"PLAIN": "v", "PASS": "s3cret", "LEVEL": "debug", "NAME": "runner-1", "NS": "ns", "IP": "127.0.0.7",
		"SA": "stack-sa", "APP": "x", "ADDR": "127.0.0.7:9090", "ESCAPED": "$(IP) $(UNKNOWN)", "POD_IP": "overridden",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	if _, ok := got["MISSING_OK"]; ok {
		t.Error("an optional variable from a missing Secret was set")
	}
	if len(got) != len(want) {
		t.Errorf("unexpected variables: %v", order)
	}
	if order[0] != "POD_IP" {
		t.Errorf("a variable the pod overrides keeps its first position, got order %v", order)
	}
}

func TestResolveEnvMissingSecretIsRetriable(t *testing.T) {
	for name, ref := range map[string]*corev1.EnvVarSource{
		"missing secret": {SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "nope"}, Key: "k"}},
		"missing key":    {SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}, Key: "nope"}},
		"missing cm key": {ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}, Key: "nope"}},
	} {
		t.Run(name, func(t *testing.T) {
			c := &corev1.Container{Env: []corev1.EnvVar{{Name: "X", ValueFrom: ref}}}
			_, err := resolveEnv(context.Background(), newObjectSource(testObjects(), "ns"), testPod(), c, "127.0.0.2", nil)
			var cfgErr *configError
			if !errors.As(err, &cfgErr) {
				t.Fatalf("want a configError, got %v", err)
			}
		})
	}
}

func TestExpand(t *testing.T) {
	lookup := func(k string) (string, bool) {
		v, ok := map[string]string{"A": "1", "B": "two"}[k]
		return v, ok
	}
	for in, want := range map[string]string{
		"":             "",
		"plain":        "plain",
		"$(A)":         "1",
		"x$(A)y$(B)z":  "x1ytwoz",
		"$$(A)":        "$(A)",
		"$(C)":         "$(C)",
		"$(A":          "$(A",
		"$":            "$",
		"cost $5":      "cost $5",
		"$(A)$(A)$$$$": "11$$",
	} {
		if got := expand(in, lookup); got != want {
			t.Errorf("expand(%q) = %q, want %q", in, got, want)
		}
	}
}
