package apiserver

import (
	"context"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/scheme"
	"github.com/terrace-dev/terrace/internal/settings"
)

// TestSettingsReaderAnswersForTheOperatorConfig: the namespace's own config
// is read; the operator's comes from the flag and is never asked for, so
// the resolved backend is the flag's where the namespace sets none.
func TestSettingsReaderAnswersForTheOperatorConfig(t *testing.T) {
	own := fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(
		&terracev1.TerraceConfig{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: terracev1.TerraceConfigName},
			Spec: terracev1.TerraceConfigSpec{State: &terracev1.StateConfig{History: ptrTo(int32(3))}}},
		// What the server cannot read in a cluster: it must not be used.
		&terracev1.TerraceConfig{ObjectMeta: metav1.ObjectMeta{Namespace: "terrace-system", Name: terracev1.TerraceConfigName},
			Spec: terracev1.TerraceConfigSpec{State: &terracev1.StateConfig{Backend: terracev1.StateBackendSecrets, History: ptrTo(int32(99))}}},
	).Build()
	state, err := ParseOperatorState(`{"backend":"postgres","postgres":{"connectionSecretRef":{"name":"pg"}},"history":5}`)
	if err != nil {
		t.Fatal(err)
	}
	resolver := &settings.Resolver{Reader: SettingsReader(own, "terrace-system", state), OperatorNamespace: "terrace-system", Builtin: settings.BuiltinDefaults("")}
	eff, err := resolver.ResolveNamespace(context.Background(), "team")
	if err != nil {
		t.Fatal(err)
	}
	if eff.StateBackend != terracev1.StateBackendPostgres || eff.History != 3 ||
		eff.PostgresConnection == nil || eff.PostgresConnection.Namespace != "terrace-system" || eff.PostgresConnection.Name != "pg" {
		t.Errorf("effective storage: backend %q history %d connection %v", eff.StateBackend, eff.History, eff.PostgresConnection)
	}

	// "{}": an operator config that sets nothing, so the built-in backend.
	none, err := ParseOperatorState("{}")
	if err != nil {
		t.Fatal(err)
	}
	resolver.Reader = SettingsReader(own, "terrace-system", none)
	if eff, err := resolver.ResolveNamespace(context.Background(), "team"); err != nil || eff.StateBackend != settings.DefaultStateBackend || eff.History != 3 {
		t.Errorf("with {}: %q %d (%v)", eff.StateBackend, eff.History, err)
	}
	// Another name in the operator namespace does not exist for the server.
	err = SettingsReader(own, "terrace-system", none).Get(context.Background(), client.ObjectKey{Namespace: "terrace-system", Name: "other"}, &terracev1.TerraceConfig{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("another name: %v", err)
	}
}

func TestParseOperatorStateRefusesBadJSON(t *testing.T) {
	for _, raw := range []string{"", "{", `{"history":"many"}`} {
		if _, err := ParseOperatorState(raw); err == nil || !strings.Contains(err.Error(), "operator namespace's state settings") {
			t.Errorf("%q: %v", raw, err)
		}
	}
}

func ptrTo[T any](v T) *T { return &v }
