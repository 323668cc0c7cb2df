package config

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
)

// What the API server's own identity may do, and what it is told instead of
// reading it: the ServiceAccount terrace-api reads its namespace's
// TerraceConfig (where state is kept) through a Role in that namespace, and
// nothing anywhere else. The operator namespace's config, which settles what
// the namespace's leaves open and alone registers other clusters, reaches it
// as the flags apiOperatorStateFlag and apiClustersFlag; a change there
// re-reconciles every namespace config (configsForOperatorConfig), which
// changes the flags and so rolls the pods.
const (
	// apiOperatorStateFlag carries the JSON of the operator namespace's
	// spec.state ({} when it sets none) to `terrace api`.
	apiOperatorStateFlag = "--operator-state"
	// apiClustersFlag carries the JSON of the operator namespace's
	// spec.api.clusters ([] when it registers none) to `terrace api`.
	apiClustersFlag = "--clusters"
	// apiPodIPEnv is the pod's IP from the downward API, which it listens on.
	apiPodIPEnv = "POD_IP"
)

// APIServerRole is the Role the controller makes for the API server of
// namespace, and all its ServiceAccount may do.
func APIServerRole(namespace string) *rbacv1.Role {
	return &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: APIName, Labels: apiLabels()},
		Rules: []rbacv1.PolicyRule{{
			APIGroups:     []string{terracev1.GroupVersion.Group},
			Resources:     []string{"terraceconfigs"},
			ResourceNames: []string{terracev1.TerraceConfigName},
			Verbs:         []string{"get"},
		}},
	}
}

// ensureAPIRBAC makes the API server's Role and RoleBinding match
// APIServerRole, owned by cfg.
func (r *Reconciler) ensureAPIRBAC(ctx context.Context, cfg *terracev1.TerraceConfig) error {
	ns := cfg.Namespace
	want := APIServerRole(ns)
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: APIName}}
	if err := r.createOrUpdateOwned(ctx, cfg, role, func() {
		role.Labels = want.Labels
		role.Rules = want.Rules
	}); err != nil {
		return err
	}
	roleRef := rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: APIName}
	if err := r.deleteBindingOfAnotherRole(ctx, ns, roleRef); err != nil {
		return err
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: APIName}}
	return r.createOrUpdateOwned(ctx, cfg, rb, func() {
		rb.Labels = apiLabels()
		rb.RoleRef = roleRef
		rb.Subjects = []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: APIName, Namespace: ns}}
	})
}

// deleteBindingOfAnotherRole deletes the RoleBinding terrace-api when it
// grants another role than roleRef (an earlier version bound the
// ClusterRole terrace-api): a binding's roleRef cannot be changed, only
// made again.
func (r *Reconciler) deleteBindingOfAnotherRole(ctx context.Context, ns string, roleRef rbacv1.RoleRef) error {
	rb := &rbacv1.RoleBinding{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: APIName}, rb)
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("failed to read RoleBinding %s/%s: %w", ns, APIName, err)
	case rb.RoleRef == roleRef:
		return nil
	}
	err = r.Client.Delete(ctx, rb, client.Preconditions{UID: &rb.UID, ResourceVersion: &rb.ResourceVersion})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("failed to replace RoleBinding %s/%s, which grants %s %s: %w", ns, APIName, rb.RoleRef.Kind, rb.RoleRef.Name, err)
	}
	return nil
}

// operatorSettings are the values of apiOperatorStateFlag and
// apiClustersFlag for the API server of a namespace.
type operatorSettings struct {
	// state is the operator namespace's spec.state as JSON, or {} when
	// there is none (or the namespace is the operator's, whose own config
	// the server reads).
	state string
	// clusters is the operator namespace's spec.api.clusters as JSON, []
	// when it registers none: the only clusters any API server may act in.
	clusters string
}

// operatorSettings reads the operator namespace's config for the API
// server of cfg's namespace (cfg itself when that is the operator's).
func (r *Reconciler) operatorSettings(ctx context.Context, cfg *terracev1.TerraceConfig) (operatorSettings, error) {
	opNS := r.Resolver.OperatorNamespace
	op := cfg
	if cfg.Namespace != opNS {
		op = &terracev1.TerraceConfig{}
		err := r.Client.Get(ctx, client.ObjectKey{Namespace: opNS, Name: terracev1.TerraceConfigName}, op)
		switch {
		case apierrors.IsNotFound(err):
			op = nil
		case err != nil:
			return operatorSettings{}, fmt.Errorf("failed to read TerraceConfig %s/%s: %w", opNS, terracev1.TerraceConfigName, err)
		}
	}
	out := operatorSettings{state: "{}", clusters: "[]"}
	if op == nil {
		return out, nil
	}
	if op.Spec.State != nil && cfg.Namespace != opNS {
		raw, err := json.Marshal(op.Spec.State)
		if err != nil {
			return operatorSettings{}, fmt.Errorf("failed to encode the state settings of TerraceConfig %s/%s: %w", opNS, terracev1.TerraceConfigName, err)
		}
		out.state = string(raw)
	}
	if op.Spec.API != nil && len(op.Spec.API.Clusters) > 0 {
		raw, err := json.Marshal(op.Spec.API.Clusters)
		if err != nil {
			return operatorSettings{}, fmt.Errorf("failed to encode the registered clusters of TerraceConfig %s/%s: %w", opNS, terracev1.TerraceConfigName, err)
		}
		out.clusters = string(raw)
	}
	return out, nil
}

// refuseNamespaceClusters is the terminal error of a config outside the
// operator namespace that registers clusters: a registered cluster is
// where API servers send their callers' bearer tokens, which only the
// cluster admin may choose. The clusters are never used.
func (r *Reconciler) refuseNamespaceClusters(cfg *terracev1.TerraceConfig) error {
	opNS := r.Resolver.OperatorNamespace
	if cfg.Namespace == opNS || cfg.Spec.API == nil || len(cfg.Spec.API.Clusters) == 0 {
		return nil
	}
	names := make([]string, len(cfg.Spec.API.Clusters))
	for i, c := range cfg.Spec.API.Clusters {
		names[i] = c.Name
	}
	return outcome.Terminalf(APIClustersNotAllowedReason,
		"spec.api.clusters (%s) is refused: only the operator namespace's TerraceConfig %s/%s registers clusters, because an API server sends its callers' tokens to them; remove them here and ask the cluster admin to register them there, where every API server may use them",
		strings.Join(names, ", "), opNS, terracev1.TerraceConfigName)
}
