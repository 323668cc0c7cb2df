package apiserver

import (
	"context"
	"encoding/json"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// The server's own identity reads only its namespace's TerraceConfig. What
// the operator namespace's config adds (where state is kept, when the
// namespace's config says nothing) is handed to it by the controller
// (`terrace api --operator-state`), so it needs no right there.

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
