package config

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	kptr "k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/settings"
	"github.com/terrace-dev/terrace/internal/version"
)

// The Installations API server of a namespace (spec.api.enabled): a
// Deployment of `terrace api` under its own ServiceAccount, a Service, a
// serving certificate from the controller's CA, and a Role with its
// RoleBinding that let that ServiceAccount read the namespace's
// TerraceConfig and nothing else: it acts with its callers' tokens for
// everything else, and the operator namespace's storage settings reach it
// as a flag (apiserver_rbac.go). Every object is in the namespace and owned
// by the TerraceConfig; the API server holds no cluster-wide right.
const (
	// APIName names the Deployment, Service, ServiceAccount, Role and RoleBinding.
	APIName = "terrace-api"
	// APITLSSecretName holds tls.crt, tls.key and ca.crt (the CA to trust).
	APITLSSecretName = "terrace-api-tls"
	// APIFinalizer removes the API server's objects before the config goes.
	APIFinalizer = "terrace.dev/api-server"
	// APIPort is the container's HTTPS port; the Service serves 443.
	APIPort = 8443

	apiCertValidity  = 24 * time.Hour
	apiConfigHashKey = "terrace.dev/config-hash"
	apiTLSHashKey    = "terrace.dev/tls-hash"
)

// APIServerSettings let the controller run API servers.
type APIServerSettings struct {
	// Issuer is the controller's CA.
	Issuer interface {
		Issue(pki.LeafRequest) (*pki.Leaf, error)
	}
	// Image is the controller's own image, which every API server runs:
	// never a TerraceConfig's runner.image, which a namespace admin chooses
	// and which would then see every caller's bearer token.
	// version.ImageReference() when empty.
	Image string
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

func (a *APIServerSettings) image() string {
	if a.Image != "" {
		return a.Image
	}
	return version.ImageReference()
}

func (a *APIServerSettings) now() time.Time {
	if a.Now != nil {
		return a.Now()
	}
	return time.Now()
}

// Every object of an API server is named terrace-api, so reading, changing
// and deleting are restricted to that name; create cannot be restricted by
// name in Kubernetes RBAC. The Deployments, Roles and RoleBindings are
// watched (metadata only) to repair them. The Role grants only what the
// controller holds itself (reading TerraceConfigs), so creating and
// binding it needs neither `escalate` nor `bind`.
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=list;watch;create
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;update;delete,resourceNames=terrace-api
// +kubebuilder:rbac:groups="",resources=services;serviceaccounts,verbs=create
// +kubebuilder:rbac:groups="",resources=services;serviceaccounts,verbs=get;update;delete,resourceNames=terrace-api
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=roles;rolebindings,verbs=list;watch;create
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=roles;rolebindings,verbs=get;update;delete,resourceNames=terrace-api
// +kubebuilder:rbac:groups=terrace.dev,resources=terraceconfigs,verbs=patch
// +kubebuilder:rbac:groups=terrace.dev,resources=terraceconfigs/finalizers,verbs=update

// apiEnabled reports whether cfg asks for an API server.
func apiEnabled(cfg *terracev1.TerraceConfig) bool {
	return cfg.DeletionTimestamp.IsZero() && cfg.Spec.API != nil && cfg.Spec.API.Enabled
}

// reconcileAPI makes the API server objects match the config: present when
// enabled, gone otherwise. It records on s when the certificate is due for
// renewal. Reconcile has added the finalizer before it runs.
func (r *Reconciler) reconcileAPI(ctx context.Context, s *configScope) error {
	if r.API == nil {
		return nil
	}
	cfg := s.config
	refused := r.refuseNamespaceClusters(cfg)
	if !apiEnabled(cfg) {
		if err := r.removeAPI(ctx, cfg); err != nil {
			return err
		}
		return refused
	}
	tlsHash, renewAt, err := r.ensureAPICertificate(ctx, cfg)
	if err != nil {
		return err
	}
	s.apiRenewAt = renewAt
	ns := cfg.Namespace
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: APIName}}
	if err := r.createOrUpdateOwned(ctx, cfg, sa, func() {}); err != nil {
		return err
	}
	if err := r.ensureAPIRBAC(ctx, cfg); err != nil {
		return err
	}
	operator, err := r.operatorSettings(ctx, cfg)
	if err != nil {
		return err
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: APIName}}
	if err := r.createOrUpdateOwned(ctx, cfg, svc, func() {
		svc.Labels = apiLabels()
		svc.Spec.Selector = apiLabels()
		svc.Spec.Ports = []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromString("https")}}
	}); err != nil {
		return err
	}
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: APIName}}
	if err := r.createOrUpdateOwned(ctx, cfg, dep, func() {
		dep.Labels = apiLabels()
		dep.Spec.Replicas = kptr.To(kptr.Deref(cfg.Spec.API.Replicas, 1))
		dep.Spec.Selector = &metav1.LabelSelector{MatchLabels: apiLabels()}
		dep.Spec.Template = apiPodTemplate(apiPod{
			namespace: ns, operatorNamespace: r.Resolver.OperatorNamespace, operatorState: operator.state, clusters: operator.clusters,
			image: r.API.image(), tokenAudiences: cfg.Spec.API.TokenAudiences, oidc: cfg.Spec.API.OIDC, configHash: configHash(cfg), tlsHash: tlsHash,
		})
	}); err != nil {
		return err
	}
	// The server runs, with the operator's clusters only; the config is
	// told what of it was refused.
	return refused
}

func apiLabels() map[string]string {
	return map[string]string{"app.kubernetes.io/name": APIName, "app.kubernetes.io/managed-by": "terrace"}
}

// configHash changes with the config's spec, so a change rolls the API pods.
func configHash(cfg *terracev1.TerraceConfig) string {
	return settings.SpecHash(cfg.Spec)
}

// apiPod is what an API server's pod template is made from.
type apiPod struct {
	namespace, operatorNamespace string
	// operatorState is the JSON of the operator namespace's spec.state
	// (apiOperatorStateFlag).
	operatorState string
	// clusters is the JSON of the operator namespace's spec.api.clusters
	// (apiClustersFlag).
	clusters string
	// image is the controller's own (APIServerSettings.Image).
	image          string
	tokenAudiences []string
	// oidc is spec.api.oidc: the console's sign-in.
	oidc       *terracev1.APIOIDC
	configHash string
	tlsHash    string
}

// apiPodTemplate runs `terrace api` from the controller's own image,
// restricted, with its certificate mounted. It listens on the pod's own IP
// (downward API), not on every address: were pods to share the host's
// network (hostNetwork), two API servers would collide on :8443.
func apiPodTemplate(p apiPod) corev1.PodTemplateSpec {
	tmpl := apiPodTemplateWithoutOIDC(p)
	withOIDC(&tmpl.Spec, p.oidc)
	return tmpl
}

// apiOIDCSecretDir and apiOIDCCADir are where spec.api.oidc's client
// secret and CA bundle are mounted.
const (
	apiOIDCSecretDir = "/etc/terrace/oidc"
	apiOIDCCADir     = "/etc/terrace/oidc-ca"
)

// withOIDC passes spec.api.oidc to `terrace api` as its --oidc-* flags; the
// client secret is a mounted file, so it is never in the pod's spec or
// command line.
func withOIDC(pod *corev1.PodSpec, oidc *terracev1.APIOIDC) {
	if oidc == nil {
		return
	}
	c := &pod.Containers[0]
	c.Args = append(c.Args, "--oidc-issuer-url="+oidc.IssuerURL, "--oidc-client-id="+oidc.ClientID, "--oidc-redirect-url="+oidc.RedirectURL)
	if len(oidc.Scopes) > 0 {
		c.Args = append(c.Args, "--oidc-scopes="+strings.Join(oidc.Scopes, ","))
	}
	if ref := oidc.ClientSecretRef; ref != nil {
		c.Args = append(c.Args, "--oidc-client-secret-file="+apiOIDCSecretDir+"/client-secret")
		mountFile(pod, "oidc", apiOIDCSecretDir, corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: ref.Name, Items: []corev1.KeyToPath{{Key: keyOr(ref.Key, terracev1.DefaultOIDCClientSecretKey), Path: "client-secret"}},
		}})
	}
	if ref := oidc.CABundleRef; ref != nil {
		c.Args = append(c.Args, "--oidc-ca-file="+apiOIDCCADir+"/ca.crt")
		mountFile(pod, "oidc-ca", apiOIDCCADir, corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: ref.Name},
			Items:                []corev1.KeyToPath{{Key: keyOr(ref.Key, terracev1.DefaultOIDCCABundleKey), Path: "ca.crt"}},
		}})
	}
}

// mountFile adds a volume and mounts it read-only in the API container.
func mountFile(pod *corev1.PodSpec, name, dir string, source corev1.VolumeSource) {
	c := &pod.Containers[0]
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: name, MountPath: dir, ReadOnly: true})
	pod.Volumes = append(pod.Volumes, corev1.Volume{Name: name, VolumeSource: source})
}

func keyOr(key, fallback string) string {
	if key == "" {
		return fallback
	}
	return key
}

func apiPodTemplateWithoutOIDC(p apiPod) corev1.PodTemplateSpec {
	args := []string{"api", "--namespace=" + p.namespace, "--operator-namespace=" + p.operatorNamespace,
		apiOperatorStateFlag + "=" + p.operatorState, apiClustersFlag + "=" + p.clusters,
		fmt.Sprintf("--listen=$(%s):%d", apiPodIPEnv, APIPort), "--tls-cert-file=/etc/terrace/tls/tls.crt", "--tls-key-file=/etc/terrace/tls/tls.key"}
	if len(p.tokenAudiences) > 0 {
		args = append(args, "--token-audiences="+strings.Join(p.tokenAudiences, ","))
	}
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: apiLabels(), Annotations: map[string]string{apiConfigHashKey: p.configHash, apiTLSHashKey: p.tlsHash}},
		Spec: corev1.PodSpec{
			ServiceAccountName: APIName,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   kptr.To(true),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:  "api",
				Image: p.image,
				Args:  args,
				Env: []corev1.EnvVar{{Name: apiPodIPEnv, ValueFrom: &corev1.EnvVarSource{
					FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "status.podIP"},
				}}},
				Ports: []corev1.ContainerPort{{Name: "https", ContainerPort: APIPort}},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromString("https"), Scheme: corev1.URISchemeHTTPS}},
					PeriodSeconds: 5,
				},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: kptr.To(false),
					ReadOnlyRootFilesystem:   kptr.To(true),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
					Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
				},
				VolumeMounts: []corev1.VolumeMount{{Name: "tls", MountPath: "/etc/terrace/tls", ReadOnly: true}},
			}},
			Volumes: []corev1.Volume{{Name: "tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: APITLSSecretName}}}},
		},
	}
}

// ensureAPICertificate issues the serving certificate when it is missing,
// names other hosts, or has less than a third of its life left. It returns
// a hash of the certificate (on the pod template: a new one rolls the pods,
// so nothing needs to reload files) and when to renew it.
func (r *Reconciler) ensureAPICertificate(ctx context.Context, cfg *terracev1.TerraceConfig) (string, time.Time, error) {
	ns := cfg.Namespace
	dns := []string{APIName, APIName + "." + ns, APIName + "." + ns + ".svc", "localhost"}
	secret := &corev1.Secret{}
	err := r.SecretReader.Get(ctx, client.ObjectKey{Namespace: ns, Name: APITLSSecretName}, secret)
	if err != nil && !apierrors.IsNotFound(err) {
		return "", time.Time{}, fmt.Errorf("failed to read Secret %s/%s: %w", ns, APITLSSecretName, err)
	}
	if err == nil {
		if leaf, perr := pki.LeafFromSecretData(secret.Data); perr == nil {
			if cert, cerr := leaf.Certificate(); cerr == nil && sameNames(cert.DNSNames, dns) {
				renewAt := cert.NotBefore.Add(cert.NotAfter.Sub(cert.NotBefore) * 2 / 3)
				if r.API.now().Before(renewAt) {
					return certHash(leaf.CertPEM), renewAt, nil
				}
			}
		}
	}
	leaf, err := r.API.Issuer.Issue(pki.LeafRequest{Identity: pki.APIIdentity(ns), Validity: apiCertValidity, DNSNames: dns})
	if err != nil {
		return "", time.Time{}, fmt.Errorf("failed to issue the API server's certificate: %w", err)
	}
	out := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: APITLSSecretName}}
	if err := r.createOrUpdateOwned(ctx, cfg, out, func() {
		out.Type = corev1.SecretTypeTLS
		out.Data = leaf.SecretData()
	}); err != nil {
		return "", time.Time{}, err
	}
	cert, err := leaf.Certificate()
	if err != nil {
		return "", time.Time{}, err
	}
	return certHash(leaf.CertPEM), cert.NotBefore.Add(cert.NotAfter.Sub(cert.NotBefore) * 2 / 3), nil
}

func sameNames(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func certHash(pem []byte) string {
	sum := sha256.Sum256(pem)
	return hex.EncodeToString(sum[:8])
}

// createOrUpdateOwned creates or updates a namespaced object owned by cfg.
func (r *Reconciler) createOrUpdateOwned(ctx context.Context, cfg *terracev1.TerraceConfig, obj client.Object, mutate func()) error {
	_, err := controllerutil.CreateOrUpdate(ctx, r.Client, obj, func() error {
		mutate()
		return controllerutil.SetControllerReference(cfg, obj, r.Client.Scheme())
	})
	if err != nil {
		return fmt.Errorf("failed to write %T %s/%s of the API server: %w", obj, obj.GetNamespace(), obj.GetName(), err)
	}
	return nil
}

// removeAPI deletes the API server's objects and, last, the finalizer,
// which is added before any of them is created: without it there is
// nothing to remove.
func (r *Reconciler) removeAPI(ctx context.Context, cfg *terracev1.TerraceConfig) error {
	if !controllerutil.ContainsFinalizer(cfg, APIFinalizer) {
		return nil
	}
	ns := cfg.Namespace
	for _, obj := range []client.Object{
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: APIName}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: APIName}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: APIName}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: APIName}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: APIName}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: APITLSSecretName}},
	} {
		if err := r.Client.Delete(ctx, obj, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("failed to remove %T %s of the API server: %w", obj, obj.GetName(), err)
		}
	}
	return r.patchFinalizer(ctx, cfg, controllerutil.RemoveFinalizer)
}
