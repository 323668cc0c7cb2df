package config

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/pki"
)

// eventuallyObject polls until obj exists and check passes.
func eventuallyObject(t *testing.T, what string, obj client.Object, check func() error) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, waitTimeout, true, func(ctx context.Context) (bool, error) {
		last = env.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj)
		if last == nil && check != nil {
			last = check()
		}
		return last == nil, nil
	})
	if err != nil {
		t.Fatalf("%s: %v", what, last)
	}
}

func eventuallyGone(t *testing.T, what string, obj client.Object) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, waitTimeout, true, func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj)
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("%s still there", what)
	}
}

func setAPI(t *testing.T, ns string, api *terracev1.APIConfig) {
	t.Helper()
	updateConfig(t, ns, func(c *terracev1.TerraceConfig) { c.Spec.API = api })
}

// updateConfig changes the namespace's TerraceConfig, retrying conflicts.
func updateConfig(t *testing.T, ns string, change func(*terracev1.TerraceConfig)) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, waitTimeout, true, func(ctx context.Context) (bool, error) {
		c := &terracev1.TerraceConfig{}
		if err := env.Client.Get(ctx, configKey(ns), c); err != nil {
			return false, err
		}
		change(c)
		err := env.Client.Update(ctx, c)
		return err == nil, nil // a conflict is retried
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestAPIServerObjectsFollowSpecAPI(t *testing.T) {
	ns := env.Namespace(t)
	createConfig(t, ns, terracev1.TerraceConfigSpec{API: &terracev1.APIConfig{Enabled: true, Replicas: ptr(int32(2))}})

	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: APIName}}
	eventuallyObject(t, "the API Deployment", dep, func() error {
		if got := *dep.Spec.Replicas; got != 2 {
			return fmt.Errorf("replicas %d", got)
		}
		return nil
	})
	pod := dep.Spec.Template.Spec
	c := pod.Containers[0]
	if pod.ServiceAccountName != APIName || c.Image != controllerImage || !slices.Contains(c.Args, "--namespace="+ns) ||
		!slices.Contains(c.Args, "--tls-cert-file=/etc/terrace/tls/tls.crt") || c.ReadinessProbe.HTTPGet.Scheme != corev1.URISchemeHTTPS {
		t.Errorf("pod template: sa %q image %q args %v", pod.ServiceAccountName, c.Image, c.Args)
	}
	// It listens on the pod's own IP: pods sharing the host's network would collide on :8443.
	if !slices.Contains(c.Args, "--listen=$(POD_IP):8443") || len(c.Env) != 1 || c.Env[0].Name != "POD_IP" ||
		c.Env[0].ValueFrom == nil || c.Env[0].ValueFrom.FieldRef == nil || c.Env[0].ValueFrom.FieldRef.FieldPath != "status.podIP" {
		t.Errorf("listen address: args %v env %+v", c.Args, c.Env)
	}
	if ref := metav1.GetControllerOf(dep); ref == nil || ref.Kind != "TerraceConfig" {
		t.Errorf("Deployment not owned by the config: %v", dep.OwnerReferences)
	}

	// The serving certificate: the API identity and the Service's names, from the controller CA.
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: APITLSSecretName}}
	eventuallyObject(t, "the API certificate", secret, nil)
	leaf, err := pki.LeafFromSecretData(secret.Data)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := leaf.Certificate()
	if err != nil {
		t.Fatal(err)
	}
	if id, err := pki.IdentityFromCertificate(cert); err != nil || id != pki.APIIdentity(ns) || !slices.Contains(cert.DNSNames, APIName+"."+ns+".svc") {
		t.Errorf("certificate: identity %v (%v), names %v", id, err, cert.DNSNames)
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: APIName}}
	eventuallyObject(t, "the API Service", svc, nil)
	if svc.Spec.Ports[0].Port != 443 || svc.Spec.Selector["app.kubernetes.io/name"] != APIName {
		t.Errorf("service: %+v", svc.Spec)
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: APIName}}
	eventuallyObject(t, "the API Role", role, nil)
	if ref := metav1.GetControllerOf(role); ref == nil || ref.Kind != "TerraceConfig" || !reflect.DeepEqual(role.Rules, APIServerRole(ns).Rules) {
		t.Errorf("Role: owners %v rules %+v", role.OwnerReferences, role.Rules)
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: APIName}}
	eventuallyObject(t, "the API RoleBinding", rb, nil)
	if rb.RoleRef != (rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: APIName}) || metav1.GetControllerOf(rb) == nil ||
		!slices.Equal(rb.Subjects, []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: APIName, Namespace: ns}}) {
		t.Errorf("RoleBinding grants %+v to %+v (owners %v)", rb.RoleRef, rb.Subjects, rb.OwnerReferences)
	}
	waitForConfig(t, ns, "Ready naming the API server", func(c *terracev1.TerraceConfig) bool {
		return strings.Contains(readyMessage(c), "https://terrace-api."+ns+".svc")
	})

	// A change of the config rolls the pods; a deleted Deployment comes back.
	hash := dep.Spec.Template.Annotations[apiConfigHashKey]
	setAPI(t, ns, &terracev1.APIConfig{Enabled: true, Replicas: ptr(int32(3))})
	eventuallyObject(t, "the Deployment following the config", dep, func() error {
		if *dep.Spec.Replicas != 3 || dep.Spec.Template.Annotations[apiConfigHashKey] == hash {
			return fmt.Errorf("replicas %d, hash %s", *dep.Spec.Replicas, dep.Spec.Template.Annotations[apiConfigHashKey])
		}
		return nil
	})
	uid := dep.UID
	if err := env.Client.Delete(context.Background(), dep); err != nil {
		t.Fatal(err)
	}
	eventuallyObject(t, "the Deployment recreated", dep, func() error {
		if dep.UID == uid {
			return fmt.Errorf("not recreated yet")
		}
		return nil
	})

	// Disabled: everything goes.
	setAPI(t, ns, &terracev1.APIConfig{Enabled: false})
	for _, obj := range []client.Object{dep, svc, role, rb, secret, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: APIName}}} {
		eventuallyGone(t, fmt.Sprintf("%T", obj), obj)
	}
	waitForConfig(t, ns, "without the finalizer", func(c *terracev1.TerraceConfig) bool {
		return !slices.Contains(c.Finalizers, APIFinalizer)
	})
}

// TestAPIServerRunsTheControllersImage: a namespace admin who names a
// runner image of their own does not get it into the API server, which
// sees every caller's bearer token; the config says the image is refused.
func TestAPIServerRunsTheControllersImage(t *testing.T) {
	ns := env.Namespace(t)
	createConfig(t, ns, terracev1.TerraceConfigSpec{
		Runner: &terracev1.RunnerConfig{Image: "evil/image"},
		API:    &terracev1.APIConfig{Enabled: true, TokenAudiences: []string{"terrace.example", "other.example"}},
	})
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: APIName}}
	eventuallyObject(t, "the API Deployment", dep, nil)
	c := dep.Spec.Template.Spec.Containers[0]
	if c.Image != controllerImage {
		t.Fatalf("the API server runs %q, want the controller's own %q", c.Image, controllerImage)
	}
	if !slices.Contains(c.Args, "--token-audiences=terrace.example,other.example") {
		t.Errorf("args %q lack the token audiences", c.Args)
	}
	got := waitForConfig(t, ns, "RunnerPolicyNarrowed naming the image", func(c *terracev1.TerraceConfig) bool {
		cond := meta.FindStatusCondition(c.Status.Conditions, RunnerPolicyNarrowedCondition)
		return cond != nil && cond.Status == metav1.ConditionTrue && strings.Contains(cond.Message, "spec.runner.image of TerraceConfig "+ns+"/default")
	})
	if !meta.IsStatusConditionTrue(got.Status.Conditions, terracev1.ReadyCondition) {
		t.Errorf("the rest of the config should work: %+v", got.Status.Conditions)
	}
	// An image the namespace may not use changes nothing when it changes either.
	hash := dep.Spec.Template.Annotations[apiConfigHashKey]
	updateConfig(t, ns, func(c *terracev1.TerraceConfig) { c.Spec.Runner.Image = "evil/image:v2" })
	eventuallyObject(t, "the Deployment rolled by the config change", dep, func() error {
		if dep.Spec.Template.Annotations[apiConfigHashKey] == hash {
			return fmt.Errorf("not rolled yet")
		}
		return nil
	})
	if img := dep.Spec.Template.Spec.Containers[0].Image; img != controllerImage {
		t.Fatalf("after the change the API server runs %q", img)
	}
}

// TestAPIServerGetsTheConsolesOIDCSettings: spec.api.oidc reaches `terrace
// api` as its --oidc-* flags, the client secret as a mounted file of the
// named Secret's key; a spec the console could not use is refused by the
// API server.
func TestAPIServerGetsTheConsolesOIDCSettings(t *testing.T) {
	ns := env.Namespace(t)
	createConfig(t, ns, terracev1.TerraceConfigSpec{API: &terracev1.APIConfig{Enabled: true, OIDC: &terracev1.APIOIDC{
		IssuerURL: "https://idp.example/realms/ops", ClientID: "terrace-console", RedirectURL: "https://console.example/oidc/callback",
		ClientSecretRef: &terracev1.SecretKeyReference{Name: "console-oidc", Key: "secret"}, Scopes: []string{"email", "groups"},
		CABundleRef: &terracev1.ConfigMapKeyReference{Name: "idp-ca"},
	}}})
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: APIName}}
	eventuallyObject(t, "the API Deployment", dep, nil)
	pod := dep.Spec.Template.Spec
	args := pod.Containers[0].Args
	for _, want := range []string{"--oidc-issuer-url=https://idp.example/realms/ops", "--oidc-client-id=terrace-console",
		"--oidc-redirect-url=https://console.example/oidc/callback", "--oidc-scopes=email,groups", "--oidc-client-secret-file=/etc/terrace/oidc/client-secret",
		"--oidc-ca-file=/etc/terrace/oidc-ca/ca.crt"} {
		if !slices.Contains(args, want) {
			t.Errorf("args %q lack %s", args, want)
		}
	}
	var mounted, caMounted bool
	for _, v := range pod.Volumes {
		if v.Secret != nil && v.Secret.SecretName == "console-oidc" && len(v.Secret.Items) == 1 && v.Secret.Items[0].Key == "secret" && v.Secret.Items[0].Path == "client-secret" {
			mounted = true
		}
		if cm := v.ConfigMap; cm != nil && cm.Name == "idp-ca" && len(cm.Items) == 1 && cm.Items[0].Key == terracev1.DefaultOIDCCABundleKey && cm.Items[0].Path == "ca.crt" {
			caMounted = true
		}
	}
	if !caMounted || !slices.ContainsFunc(pod.Containers[0].VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/etc/terrace/oidc-ca" && m.ReadOnly }) {
		t.Errorf("the CA bundle is not mounted: volumes %+v, mounts %+v", pod.Volumes, pod.Containers[0].VolumeMounts)
	}
	if !mounted || !slices.ContainsFunc(pod.Containers[0].VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/etc/terrace/oidc" && m.ReadOnly }) {
		t.Errorf("the client secret is not mounted: volumes %+v, mounts %+v", pod.Volumes, pod.Containers[0].VolumeMounts)
	}

	// Changing the provider rolls the pods with the new flags.
	updateConfig(t, ns, func(c *terracev1.TerraceConfig) {
		c.Spec.API.OIDC.ClientSecretRef, c.Spec.API.OIDC.Scopes, c.Spec.API.OIDC.CABundleRef = nil, nil, nil
	})
	eventuallyObject(t, "the Deployment without a client secret", dep, func() error {
		for _, a := range dep.Spec.Template.Spec.Containers[0].Args {
			if strings.HasPrefix(a, "--oidc-client-secret-file") || strings.HasPrefix(a, "--oidc-scopes") || strings.HasPrefix(a, "--oidc-ca-file") {
				return fmt.Errorf("still %s", a)
			}
		}
		if len(dep.Spec.Template.Spec.Volumes) != 1 {
			return fmt.Errorf("volumes %+v", dep.Spec.Template.Spec.Volumes)
		}
		return nil
	})

	other := env.Namespace(t)
	for name, oidc := range map[string]terracev1.APIOIDC{
		"openid among the scopes": {IssuerURL: "https://idp.example", ClientID: "c", RedirectURL: "https://c.example/oidc/callback", Scopes: []string{"openid", "email"}},
		"a plain-HTTP issuer":     {IssuerURL: "http://idp.example", ClientID: "c", RedirectURL: "https://c.example/oidc/callback"},
		"another callback path":   {IssuerURL: "https://idp.example", ClientID: "c", RedirectURL: "https://c.example/callback"},
		"no client ID":            {IssuerURL: "https://idp.example", RedirectURL: "https://c.example/oidc/callback"},
	} {
		err := env.Client.Create(context.Background(), tcfg(other, terracev1.TerraceConfigSpec{API: &terracev1.APIConfig{Enabled: true, OIDC: &oidc}}))
		if !apierrors.IsInvalid(err) {
			t.Errorf("%s: created (%v), want refused", name, err)
		}
	}
}
