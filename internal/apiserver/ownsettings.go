package apiserver

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// The server's own identity reads only its namespace's TerraceConfig. What
// the operator namespace's config adds (where state is kept, when the
// namespace's config says nothing, and the clusters a call may name) is
// handed to it by the controller (`terrace api --operator-state`,
// `--clusters`), so it needs no right there.

// ParseClusters reads the JSON of a TerraceConfig's spec.api.clusters, as
// the controller passes it; "[]" registers none.
func ParseClusters(raw string) ([]terracev1.APICluster, error) {
	var clusters []terracev1.APICluster
	if err := json.Unmarshal([]byte(raw), &clusters); err != nil {
		return nil, fmt.Errorf("failed to parse the registered clusters %q: %w", raw, err)
	}
	seen := map[string]bool{}
	for _, c := range clusters {
		switch {
		case c.Name == "" || seen[c.Name]:
			return nil, fmt.Errorf("registered clusters: every cluster needs a name of its own (%q)", c.Name)
		case !strings.HasPrefix(c.Server, "https://"):
			return nil, fmt.Errorf("registered cluster %s: server %q is not an https:// URL", c.Name, c.Server)
		}
		seen[c.Name] = true
	}
	return clusters, nil
}

// OperatorClusters reads the registered clusters from the operator
// namespace's TerraceConfig with r (the server's own identity), for a
// server started without --clusters; none when there is no such config.
func OperatorClusters(ctx context.Context, r client.Reader, operatorNamespace string) ([]terracev1.APICluster, error) {
	cfg := &terracev1.TerraceConfig{}
	err := r.Get(ctx, client.ObjectKey{Namespace: operatorNamespace, Name: terracev1.TerraceConfigName}, cfg)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("failed to read the registered clusters from TerraceConfig %s/%s (pass --clusters='[]' to serve without any): %w", operatorNamespace, terracev1.TerraceConfigName, err)
	case cfg.Spec.API == nil:
		return nil, nil
	}
	return cfg.Spec.API.Clusters, nil
}

// ParseOperatorState reads the JSON of a TerraceConfig's spec.state, as
// the controller passes it; "{}" is a config that sets none.
func ParseOperatorState(raw string) (*terracev1.StateConfig, error) {
	state := &terracev1.StateConfig{}
	if err := json.Unmarshal([]byte(raw), state); err != nil {
		return nil, fmt.Errorf("failed to parse the operator namespace's state settings %q: %w", raw, err)
	}
	return state, nil
}

// SettingsReader is the reader of a settings.Resolver for the server: it
// answers for TerraceConfig operatorNamespace/default with a config whose
// spec.state is state, without asking the Kubernetes API, and reads every
// other object through own.
func SettingsReader(own client.Reader, operatorNamespace string, state *terracev1.StateConfig) client.Reader {
	return &settingsReader{Reader: own, operatorNamespace: operatorNamespace, state: state}
}

type settingsReader struct {
	client.Reader
	operatorNamespace string
	state             *terracev1.StateConfig
}

func (r *settingsReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	cfg, ok := obj.(*terracev1.TerraceConfig)
	if !ok || key.Namespace != r.operatorNamespace {
		return r.Reader.Get(ctx, key, obj, opts...)
	}
	if key.Name != terracev1.TerraceConfigName {
		return apierrors.NewNotFound(schema.GroupResource{Group: terracev1.GroupVersion.Group, Resource: "terraceconfigs"}, key.Name)
	}
	*cfg = terracev1.TerraceConfig{}
	cfg.Namespace, cfg.Name = key.Namespace, key.Name
	cfg.Spec.State = r.state.DeepCopy()
	return nil
}

// ConfigReader reads the TerraceConfigs a call needs: those of the
// server's namespace and of the operator namespace with the server's own
// identity (own), and another namespace's, where a call names a Stack
// outside the server's namespace, as the call's caller (caller, whose
// requests carry the token of the context they are made with): the server
// holds no right there.
func ConfigReader(own, caller client.Reader, namespace, operatorNamespace string) client.Reader {
	return &configReader{Reader: own, caller: caller, namespace: namespace, operatorNamespace: operatorNamespace}
}

type configReader struct {
	client.Reader
	caller                       client.Reader
	namespace, operatorNamespace string
}

func (r *configReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*terracev1.TerraceConfig); ok && key.Namespace != r.namespace && key.Namespace != r.operatorNamespace {
		return r.caller.Get(ctx, key, obj, opts...)
	}
	return r.Reader.Get(ctx, key, obj, opts...)
}
