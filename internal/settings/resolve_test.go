package settings

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/runnerpolicy"
	"github.com/terrace-dev/terrace/internal/scheme"
)

const (
	opNS   = "terrace-system"
	teamNS = "team-a"
)

func tcfg(ns string, spec terracev1.TerraceConfigSpec) *terracev1.TerraceConfig {
	return &terracev1.TerraceConfig{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: terracev1.TerraceConfigName}, Spec: spec}
}

func stack(spec terracev1.StackSpec) *terracev1.Stack {
	return &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Namespace: teamNS, Name: "web"}, Spec: spec}
}

func ptr[T any](v T) *T { return &v }

func resources(cpu string) *corev1.ResourceRequirements {
	return &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}}
}

func resolver(objs ...client.Object) *Resolver {
	c := fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(objs...).Build()
	return &Resolver{Reader: c, OperatorNamespace: opNS, Builtin: BuiltinDefaults("ghcr.io/terrace-dev/terrace:v1")}
}

// TestResolveFieldByField sets each field at one level and checks that it
// wins over the levels below and that the other fields fall through.
func TestResolveFieldByField(t *testing.T) {
	builtin := BuiltinDefaults("ghcr.io/terrace-dev/terrace:v1")
	for _, tc := range []struct {
		name    string
		stack   terracev1.StackSpec
		ns, op  *terracev1.TerraceConfigSpec
		want    func(e *Effective) // applied to the built-in defaults
		sources []string
	}{
		{
			name:    "no configs: built-in",
			want:    func(*Effective) {},
			sources: []string{BuiltinSource},
		},
		{
			name:    "image from the stack beats both configs",
			stack:   terracev1.StackSpec{Runner: &terracev1.RunnerPodTemplate{Image: "stack:1"}},
			ns:      &terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{Image: "ns:1"}},
			op:      &terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{Image: "op:1"}},
			want:    func(e *Effective) { e.RunnerImage = "stack:1" },
			sources: []string{BuiltinSource},
		},
		{
			name:    "image from the namespace config beats the operator config",
			ns:      &terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{Image: "ns:1"}},
			op:      &terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{Image: "op:1"}},
			want:    func(e *Effective) { e.RunnerImage = "ns:1" },
			sources: []string{"team-a/default", BuiltinSource},
		},
		{
			name:    "image from the operator config when the namespace config sets other fields",
			ns:      &terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{Binary: terracev1.BinaryTerraform}},
			op:      &terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{Image: "op:1"}},
			want:    func(e *Effective) { e.RunnerImage = "op:1"; e.Binary = terracev1.BinaryTerraform },
			sources: []string{"team-a/default", "terrace-system/default", BuiltinSource},
		},
		{
			name:    "binary from the operator config",
			op:      &terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{Binary: terracev1.BinaryTerraform}},
			want:    func(e *Effective) { e.Binary = terracev1.BinaryTerraform },
			sources: []string{"terrace-system/default", BuiltinSource},
		},
		{
			name:  "service account: stack, then namespace config",
			stack: terracev1.StackSpec{ServiceAccountName: "stack-sa"},
			ns:    &terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{ServiceAccountName: "ns-sa"}},
			want:  func(e *Effective) { e.ServiceAccountName = "stack-sa" },
			// the namespace config's only field lost to the stack: not a source
			sources: []string{BuiltinSource},
		},
		{
			name:    "service account from the namespace config",
			ns:      &terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{ServiceAccountName: "ns-sa"}},
			op:      &terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{ServiceAccountName: "op-sa"}},
			want:    func(e *Effective) { e.ServiceAccountName = "ns-sa" },
			sources: []string{"team-a/default", BuiltinSource},
		},
		{
			name:    "resources from the stack, whole",
			stack:   terracev1.StackSpec{Runner: &terracev1.RunnerPodTemplate{Resources: resources("2")}},
			ns:      &terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{Resources: resources("1")}},
			want:    func(e *Effective) { e.Resources = resources("2") },
			sources: []string{BuiltinSource},
		},
		{
			name:    "resources from the operator config",
			op:      &terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{Resources: resources("500m")}},
			want:    func(e *Effective) { e.Resources = resources("500m") },
			sources: []string{"terrace-system/default", BuiltinSource},
		},
		{
			name: "env: nearest config's list, then the stack's appended, stack wins by name",
			stack: terracev1.StackSpec{Runner: &terracev1.RunnerPodTemplate{Env: []corev1.EnvVar{
				{Name: "B", Value: "stack"}, {Name: "C", Value: "stack"},
			}}},
			ns: &terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{Env: []corev1.EnvVar{{Name: "A", Value: "ns"}, {Name: "B", Value: "ns"}}}},
			op: &terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{Env: []corev1.EnvVar{{Name: "OP", Value: "op"}}}},
			want: func(e *Effective) {
				e.Env = []corev1.EnvVar{{Name: "A", Value: "ns"}, {Name: "B", Value: "stack"}, {Name: "C", Value: "stack"}}
			},
			sources: []string{"team-a/default", BuiltinSource},
		},
		{
			name:    "retain false in the namespace config overrides true in the operator config",
			ns:      &terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{Retain: ptr(false)}},
			op:      &terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{Retain: ptr(true)}},
			want:    func(e *Effective) { e.Retain = false },
			sources: []string{"team-a/default", BuiltinSource},
		},
		{
			name:    "retain from the operator config",
			op:      &terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{Retain: ptr(true)}},
			want:    func(e *Effective) { e.Retain = true },
			sources: []string{"terrace-system/default", BuiltinSource},
		},
		{
			name: "postgres backend from the operator config, its Secret in the operator namespace",
			op: &terracev1.TerraceConfigSpec{State: &terracev1.StateConfig{
				Backend:  terracev1.StateBackendPostgres,
				Postgres: &terracev1.PostgresConfig{ConnectionSecretRef: terracev1.SecretKeyReference{Name: "pg"}},
			}},
			want: func(e *Effective) {
				e.StateBackend = terracev1.StateBackendPostgres
				e.PostgresConnection = &SecretKeyRef{Namespace: opNS, Name: "pg", Key: DefaultPostgresURLKey}
			},
			sources: []string{"terrace-system/default", BuiltinSource},
		},
		{
			name: "namespace config's connection with the operator config's backend",
			ns: &terracev1.TerraceConfigSpec{State: &terracev1.StateConfig{
				Postgres: &terracev1.PostgresConfig{ConnectionSecretRef: terracev1.SecretKeyReference{Name: "team-pg", Key: "dsn"}},
			}},
			op: &terracev1.TerraceConfigSpec{State: &terracev1.StateConfig{
				Backend:  terracev1.StateBackendPostgres,
				Postgres: &terracev1.PostgresConfig{ConnectionSecretRef: terracev1.SecretKeyReference{Name: "pg"}},
			}},
			want: func(e *Effective) {
				e.StateBackend = terracev1.StateBackendPostgres
				e.PostgresConnection = &SecretKeyRef{Namespace: teamNS, Name: "team-pg", Key: "dsn"}
			},
			sources: []string{"team-a/default", "terrace-system/default", BuiltinSource},
		},
		{
			name: "secrets backend in the namespace ignores the operator's connection",
			ns:   &terracev1.TerraceConfigSpec{State: &terracev1.StateConfig{Backend: terracev1.StateBackendSecrets}},
			op: &terracev1.TerraceConfigSpec{State: &terracev1.StateConfig{
				Backend:  terracev1.StateBackendPostgres,
				Postgres: &terracev1.PostgresConfig{ConnectionSecretRef: terracev1.SecretKeyReference{Name: "pg"}},
			}},
			want:    func(e *Effective) {},
			sources: []string{"team-a/default", BuiltinSource},
		},
		{
			name: "encryption key from the namespace config, default key name",
			ns: &terracev1.TerraceConfigSpec{State: &terracev1.StateConfig{
				Encryption: &terracev1.EncryptionConfig{KeySecretRef: terracev1.SecretKeyReference{Name: "enc"}},
			}},
			op: &terracev1.TerraceConfigSpec{State: &terracev1.StateConfig{
				Encryption: &terracev1.EncryptionConfig{KeySecretRef: terracev1.SecretKeyReference{Name: "op-enc", Key: "k"}},
			}},
			want: func(e *Effective) {
				e.EncryptionKey = &SecretKeyRef{Namespace: teamNS, Name: "enc", Key: DefaultEncryptionKeyKey}
			},
			sources: []string{"team-a/default", BuiltinSource},
		},
		{
			name: "encryption key from the operator config",
			op: &terracev1.TerraceConfigSpec{State: &terracev1.StateConfig{
				Encryption: &terracev1.EncryptionConfig{KeySecretRef: terracev1.SecretKeyReference{Name: "op-enc", Key: "k"}},
			}},
			want:    func(e *Effective) { e.EncryptionKey = &SecretKeyRef{Namespace: opNS, Name: "op-enc", Key: "k"} },
			sources: []string{"terrace-system/default", BuiltinSource},
		},
		{
			name:    "history from the namespace config",
			ns:      &terracev1.TerraceConfigSpec{State: &terracev1.StateConfig{History: ptr(int32(3))}},
			op:      &terracev1.TerraceConfigSpec{State: &terracev1.StateConfig{History: ptr(int32(50))}},
			want:    func(e *Effective) { e.History = 3 },
			sources: []string{"team-a/default", BuiltinSource},
		},
		{
			name:    "interval: stack beats configs",
			stack:   terracev1.StackSpec{Interval: &metav1.Duration{Duration: time.Minute}},
			ns:      &terracev1.TerraceConfigSpec{Defaults: &terracev1.StackDefaults{Interval: &metav1.Duration{Duration: time.Hour}}},
			want:    func(e *Effective) { e.Interval = time.Minute },
			sources: []string{BuiltinSource},
		},
		{
			name:    "interval from the operator config",
			op:      &terracev1.TerraceConfigSpec{Defaults: &terracev1.StackDefaults{Interval: &metav1.Duration{Duration: time.Hour}}},
			want:    func(e *Effective) { e.Interval = time.Hour },
			sources: []string{"terrace-system/default", BuiltinSource},
		},
		{
			name:    "drift mode: stack beats configs",
			stack:   terracev1.StackSpec{DriftDetection: &terracev1.DriftDetection{Mode: terracev1.DriftDetectionDisabled}},
			op:      &terracev1.TerraceConfigSpec{Defaults: &terracev1.StackDefaults{DriftDetection: &terracev1.DriftDetection{Mode: terracev1.DriftDetectionWarn}}},
			want:    func(e *Effective) { e.DriftMode = terracev1.DriftDetectionDisabled },
			sources: []string{BuiltinSource},
		},
		{
			name:    "drift mode from the namespace config; an empty stack mode falls through",
			stack:   terracev1.StackSpec{DriftDetection: &terracev1.DriftDetection{}},
			ns:      &terracev1.TerraceConfigSpec{Defaults: &terracev1.StackDefaults{DriftDetection: &terracev1.DriftDetection{Mode: terracev1.DriftDetectionWarn}}},
			want:    func(e *Effective) { e.DriftMode = terracev1.DriftDetectionWarn },
			sources: []string{"team-a/default", BuiltinSource},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := namespaceAndOperatorConfigs(tc.ns, tc.op)
			got, err := resolver(objs...).Resolve(context.Background(), stack(tc.stack))
			if err != nil {
				t.Fatal(err)
			}
			want := builtin
			tc.want(&want)
			want.Sources = tc.sources
			// Where the backend comes from, and the runner policy, have their own tests.
			got.NamedPostgresConnection, got.StateBackendSource = nil, ""
			got.RunnerPolicy, got.RunnerPolicyNotes, got.RunnerImageField, got.ServiceAccountField = runnerpolicy.Policy{}, nil, "", ""
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got  %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestResolveEverythingFromConfigsNeedsNoBuiltin(t *testing.T) {
	full := terracev1.TerraceConfigSpec{
		Runner: &terracev1.RunnerConfig{Image: "i", Binary: terracev1.BinaryTofu, ServiceAccountName: "sa", Resources: resources("1"), Env: []corev1.EnvVar{{Name: "A"}}, Retain: ptr(true), Warm: ptr(int32(1))},
		State: &terracev1.StateConfig{
			Backend:    terracev1.StateBackendPostgres,
			Postgres:   &terracev1.PostgresConfig{ConnectionSecretRef: terracev1.SecretKeyReference{Name: "pg"}},
			Encryption: &terracev1.EncryptionConfig{KeySecretRef: terracev1.SecretKeyReference{Name: "enc"}},
			History:    ptr(int32(5)),
		},
		Defaults: &terracev1.StackDefaults{Interval: &metav1.Duration{Duration: time.Minute}, DriftDetection: &terracev1.DriftDetection{Mode: terracev1.DriftDetectionWarn}},
	}
	got, err := resolver(tcfg(teamNS, full), tcfg(opNS, full)).ResolveNamespace(context.Background(), teamNS)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.Sources, []string{"team-a/default"}) {
		t.Errorf("sources %v, want only the namespace config", got.Sources)
	}
}

func TestResolveInTheOperatorNamespaceReadsItsConfigOnce(t *testing.T) {
	r := resolver(tcfg(opNS, terracev1.TerraceConfigSpec{Runner: &terracev1.RunnerConfig{Image: "op:1"}}))
	got, err := r.ResolveNamespace(context.Background(), opNS)
	if err != nil {
		t.Fatal(err)
	}
	if got.RunnerImage != "op:1" || !reflect.DeepEqual(got.Sources, []string{"terrace-system/default", BuiltinSource}) {
		t.Errorf("got %+v", got)
	}
}

func TestResolveReturnsReadErrors(t *testing.T) {
	boom := errors.New("apiserver unavailable")
	c := fake.NewClientBuilder().WithScheme(scheme.New()).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if key.Namespace == opNS {
				return boom
			}
			return c.Get(ctx, key, obj, opts...)
		},
	}).Build()
	r := &Resolver{Reader: c, OperatorNamespace: opNS, Builtin: BuiltinDefaults("x")}
	if _, err := r.Resolve(context.Background(), stack(terracev1.StackSpec{})); !errors.Is(err, boom) {
		t.Fatalf("err %v, want the read error", err)
	}
}

func TestHash(t *testing.T) {
	a := BuiltinDefaults("img:1")
	b := BuiltinDefaults("img:1")
	b.Sources = []string{"somewhere"}
	if a.Hash() != b.Hash() {
		t.Error("Sources changed the hash")
	}
	for name, change := range map[string]func(e *Effective){
		"image":      func(e *Effective) { e.RunnerImage = "img:2" },
		"env":        func(e *Effective) { e.Env = []corev1.EnvVar{{Name: "A", Value: "1"}} },
		"resources":  func(e *Effective) { e.Resources = resources("1") },
		"interval":   func(e *Effective) { e.Interval = time.Second },
		"drift":      func(e *Effective) { e.DriftMode = terracev1.DriftDetectionWarn },
		"encryption": func(e *Effective) { e.EncryptionKey = &SecretKeyRef{Namespace: "n", Name: "s", Key: "k"} },
	} {
		c := BuiltinDefaults("img:1")
		change(&c)
		if c.Hash() == a.Hash() {
			t.Errorf("changing %s kept the hash", name)
		}
	}
	storage := BuiltinDefaults("img:1")
	storage.RunnerImage = "img:2"
	if storage.StorageHash() != a.StorageHash() {
		t.Error("the runner image changed the storage hash")
	}
	storage.History = 3
	if storage.StorageHash() == a.StorageHash() {
		t.Error("history did not change the storage hash")
	}
	// Equal quantities written differently are the same setting.
	x, y := BuiltinDefaults("i"), BuiltinDefaults("i")
	x.Resources, y.Resources = resources("1000m"), resources("1")
	if x.Hash() != y.Hash() {
		t.Error("1000m and 1 CPU hash differently")
	}
}

func TestStateBackendSourceAndNamedConnection(t *testing.T) {
	pg := &terracev1.PostgresConfig{ConnectionSecretRef: terracev1.SecretKeyReference{Name: "pg"}}
	cases := []struct {
		name       string
		ns, op     *terracev1.TerraceConfigSpec
		wantSource string
		wantConn   *SecretKeyRef
	}{
		{"nothing set", nil, nil, BuiltinSource, nil},
		{"backend from the operator config", nil, &terracev1.TerraceConfigSpec{State: &terracev1.StateConfig{Backend: terracev1.StateBackendPostgres, Postgres: pg}},
			opNS + "/default", &SecretKeyRef{Namespace: opNS, Name: "pg", Key: DefaultPostgresURLKey}},
		{"the namespace config moves back to secrets but still names the connection",
			&terracev1.TerraceConfigSpec{State: &terracev1.StateConfig{Backend: terracev1.StateBackendSecrets, Postgres: pg}},
			&terracev1.TerraceConfigSpec{State: &terracev1.StateConfig{Backend: terracev1.StateBackendPostgres}},
			teamNS + "/default", &SecretKeyRef{Namespace: teamNS, Name: "pg", Key: DefaultPostgresURLKey}},
		{"a namespace config without a backend inherits it", &terracev1.TerraceConfigSpec{State: &terracev1.StateConfig{History: ptr(int32(3))}},
			&terracev1.TerraceConfigSpec{State: &terracev1.StateConfig{Backend: terracev1.StateBackendSecrets}}, opNS + "/default", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			objs := namespaceAndOperatorConfigs(tc.ns, tc.op)
			got, err := resolver(objs...).ResolveNamespace(context.Background(), teamNS)
			if err != nil {
				t.Fatal(err)
			}
			if got.StateBackendSource != tc.wantSource {
				t.Errorf("StateBackendSource = %q, want %q", got.StateBackendSource, tc.wantSource)
			}
			if !reflect.DeepEqual(got.NamedPostgresConnection, tc.wantConn) {
				t.Errorf("NamedPostgresConnection = %+v, want %+v", got.NamedPostgresConnection, tc.wantConn)
			}
		})
	}
}

// namespaceAndOperatorConfigs returns the TerraceConfigs given: the team
// namespace's and the operator namespace's.
func namespaceAndOperatorConfigs(ns, op *terracev1.TerraceConfigSpec) []client.Object {
	var objs []client.Object
	if ns != nil {
		objs = append(objs, tcfg(teamNS, *ns))
	}
	if op != nil {
		objs = append(objs, tcfg(opNS, *op))
	}
	return objs
}

// TestStacksForConfig: a namespace's config enqueues that namespace's
// Stacks, the operator namespace's config every Stack, and a config not
// named default nothing.
func TestStacksForConfig(t *testing.T) {
	stackIn := func(ns, name string) client.Object {
		return &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	}
	c := fake.NewClientBuilder().WithScheme(scheme.New()).
		WithObjects(stackIn(teamNS, "a1"), stackIn(teamNS, "a2"), stackIn("team-b", "b1")).Build()
	mapFn := StacksForConfig(c, opNS)
	requested := func(cfg *terracev1.TerraceConfig) []string {
		var out []string
		for _, r := range mapFn(context.Background(), cfg) {
			out = append(out, r.Namespace+"/"+r.Name)
		}
		slices.Sort(out)
		return out
	}
	for _, tc := range []struct {
		name string
		cfg  *terracev1.TerraceConfig
		want []string
	}{
		{"a namespace's config", tcfg(teamNS, terracev1.TerraceConfigSpec{}), []string{"team-a/a1", "team-a/a2"}},
		{"another namespace's config", tcfg("team-b", terracev1.TerraceConfigSpec{}), []string{"team-b/b1"}},
		{"the operator's config", tcfg(opNS, terracev1.TerraceConfigSpec{}), []string{"team-a/a1", "team-a/a2", "team-b/b1"}},
		{"a config not named default", &terracev1.TerraceConfig{ObjectMeta: metav1.ObjectMeta{Namespace: teamNS, Name: "not-default"}}, nil},
	} {
		if got := requested(tc.cfg); !slices.Equal(got, tc.want) {
			t.Errorf("%s enqueued %v, want %v", tc.name, got, tc.want)
		}
	}
}
