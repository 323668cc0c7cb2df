package settings

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/runnerpolicy"
)

// Resolver computes Effective settings. Reader is usually the manager's
// cached client (TerraceConfigs are small and watched anyway).
type Resolver struct {
	Reader client.Reader
	// OperatorNamespace holds the cluster-default TerraceConfig.
	OperatorNamespace string
	// Builtin is what applies when nothing else sets a field; see BuiltinDefaults.
	Builtin Effective
}

// layer is one source of settings, nearest first. The Stack is expressed as
// a TerraceConfigSpec too so that every field resolves the same way.
type layer struct {
	// source names the layer in Effective.Sources; "" for the Stack itself.
	source string
	// namespace holds the Secrets the layer's references name.
	namespace string
	spec      *terracev1.TerraceConfigSpec
}

// Resolve returns the settings of stack: its own fields, then the
// TerraceConfig of its namespace, then the operator namespace's, then the
// built-in defaults, field by field. A missing TerraceConfig is skipped; an
// error reading one is returned.
func (r *Resolver) Resolve(ctx context.Context, stack *terracev1.Stack) (Effective, error) {
	configs, err := r.configLayers(ctx, stack.Namespace)
	if err != nil {
		return Effective{}, err
	}
	eff := r.merge(append([]layer{stackLayer(stack)}, configs...))
	if stack.Spec.Runner != nil {
		eff.Env = mergeEnv(eff.Env, stack.Spec.Runner.Env)
	}
	return eff, nil
}

// ResolveNamespace returns the settings of a namespace without any Stack
// fields: what governs storage there, and what a Stack setting nothing gets.
func (r *Resolver) ResolveNamespace(ctx context.Context, namespace string) (Effective, error) {
	configs, err := r.configLayers(ctx, namespace)
	if err != nil {
		return Effective{}, err
	}
	return r.merge(configs), nil
}

// configLayers reads the namespace's TerraceConfig and the operator
// namespace's, skipping those that do not exist.
func (r *Resolver) configLayers(ctx context.Context, namespace string) ([]layer, error) {
	namespaces := []string{namespace}
	if r.OperatorNamespace != "" && r.OperatorNamespace != namespace {
		namespaces = append(namespaces, r.OperatorNamespace)
	}
	var layers []layer
	for _, ns := range namespaces {
		cfg := &terracev1.TerraceConfig{}
		err := r.Reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: terracev1.TerraceConfigName}, cfg)
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return nil, fmt.Errorf("failed to read TerraceConfig %s/%s: %w", ns, terracev1.TerraceConfigName, err)
		}
		layers = append(layers, layer{source: ns + "/" + terracev1.TerraceConfigName, namespace: ns, spec: &cfg.Spec})
	}
	return layers, nil
}

// stackLayer expresses the fields a Stack may set as a config layer.
func stackLayer(stack *terracev1.Stack) layer {
	spec := &terracev1.TerraceConfigSpec{
		Runner:   &terracev1.RunnerConfig{ServiceAccountName: stack.Spec.ServiceAccountName},
		Defaults: &terracev1.StackDefaults{Interval: stack.Spec.Interval, DriftDetection: stack.Spec.DriftDetection},
	}
	if rt := stack.Spec.Runner; rt != nil {
		spec.Runner.Image = rt.Image
		spec.Runner.Resources = rt.Resources
	}
	return layer{namespace: stack.Namespace, spec: spec}
}

// merge takes every field from the first layer that sets it, else from the builtin.
func (r *Resolver) merge(layers []layer) Effective {
	b := r.Builtin
	m := merger{layers: layers}
	eff := Effective{
		RunnerImage: pick(&m, b.RunnerImage, func(s *terracev1.TerraceConfigSpec) (string, bool) { return s.Runner.Image, s.Runner.Image != "" }),
		Binary: pick(&m, b.Binary, func(s *terracev1.TerraceConfigSpec) (terracev1.RunnerBinary, bool) {
			return s.Runner.Binary, s.Runner.Binary != ""
		}),
		ServiceAccountName: pick(&m, b.ServiceAccountName, func(s *terracev1.TerraceConfigSpec) (string, bool) {
			return s.Runner.ServiceAccountName, s.Runner.ServiceAccountName != ""
		}),
		Resources: pick(&m, b.Resources.DeepCopy(), func(s *terracev1.TerraceConfigSpec) (*corev1.ResourceRequirements, bool) {
			return s.Runner.Resources.DeepCopy(), s.Runner.Resources != nil
		}),
		Env: pick(&m, slices.Clone(b.Env), func(s *terracev1.TerraceConfigSpec) ([]corev1.EnvVar, bool) {
			return slices.Clone(s.Runner.Env), s.Runner.Env != nil
		}),
		Retain: pick(&m, b.Retain, func(s *terracev1.TerraceConfigSpec) (bool, bool) {
			return ptrValue(s.Runner.Retain), s.Runner.Retain != nil
		}),
		Warm: pick(&m, b.Warm, func(s *terracev1.TerraceConfigSpec) (int32, bool) {
			return ptrValue(s.Runner.Warm), s.Runner.Warm != nil
		}),
		StateBackend: pick(&m, b.StateBackend, func(s *terracev1.TerraceConfigSpec) (terracev1.StateBackend, bool) {
			return s.State.Backend, s.State.Backend != ""
		}),
		EncryptionKey: pickRef(&m, b.EncryptionKey, DefaultEncryptionKeyKey, func(s *terracev1.TerraceConfigSpec) *terracev1.SecretKeyReference {
			if s.State.Encryption == nil {
				return nil
			}
			return &s.State.Encryption.KeySecretRef
		}),
		History: pick(&m, b.History, func(s *terracev1.TerraceConfigSpec) (int32, bool) {
			return ptrValue(s.State.History), s.State.History != nil
		}),
		Interval: pick(&m, b.Interval, func(s *terracev1.TerraceConfigSpec) (time.Duration, bool) {
			return ptrValue(s.Defaults.Interval).Duration, s.Defaults.Interval != nil
		}),
		DriftMode: pick(&m, b.DriftMode, func(s *terracev1.TerraceConfigSpec) (terracev1.DriftDetectionMode, bool) {
			if s.Defaults.DriftDetection == nil {
				return "", false
			}
			return s.Defaults.DriftDetection.Mode, s.Defaults.DriftDetection.Mode != ""
		}),
	}
	postgresRef := func(s *terracev1.TerraceConfigSpec) *terracev1.SecretKeyReference {
		if s.State.Postgres == nil {
			return nil
		}
		return &s.State.Postgres.ConnectionSecretRef
	}
	// A connection only matters to, and only counts as a source for, the postgres backend.
	if eff.StateBackend == terracev1.StateBackendPostgres {
		eff.PostgresConnection = pickRef(&m, b.PostgresConnection, DefaultPostgresURLKey, postgresRef)
	}
	eff.NamedPostgresConnection = pickRef(&merger{layers: layers}, b.PostgresConnection, DefaultPostgresURLKey, postgresRef)
	eff.StateBackendSource = BuiltinSource
	for _, l := range layers {
		if st := normalized(l.spec).State; st.Backend != "" && l.source != "" {
			eff.StateBackendSource = l.source
			break
		}
	}
	eff.Sources = m.sources()
	r.resolveRunnerPolicy(&eff, layers)
	eff.PlanPolicies = planPolicies(layers)
	return eff
}

// planPolicies collects the policy ConfigMaps of every config layer: a
// namespace's config adds to the operator's, never replaces them.
func planPolicies(layers []layer) []PolicyConfigMap {
	var out []PolicyConfigMap
	for _, l := range layers {
		if l.source == "" || l.spec.PlanPolicy == nil {
			continue
		}
		for _, ref := range l.spec.PlanPolicy.ConfigMapRefs {
			out = append(out, PolicyConfigMap{Namespace: l.namespace, Name: ref.Name, Source: l.source})
		}
	}
	return out
}

// resolveRunnerPolicy sets the runner policy, which is not taken field by
// field: the operator namespace's config is the floor, the namespace's
// config may only narrow it. It also records where the runner image and
// ServiceAccount came from, which violations name.
func (r *Resolver) resolveRunnerPolicy(eff *Effective, layers []layer) {
	floor := runnerpolicy.Layer{Source: BuiltinSource, ServiceAccountName: r.Builtin.ServiceAccountName}
	defaultImage := r.Builtin.RunnerImage
	var ns *runnerpolicy.Layer
	eff.RunnerImageField, eff.ServiceAccountField = "the controller's default runner image", "the default ServiceAccount"
	imageSet, saSet := false, false
	for _, l := range layers {
		runner := normalized(l.spec).Runner
		switch {
		case l.source == "":
			// the Stack: no policy of its own
		case l.namespace == r.OperatorNamespace:
			floor = runnerpolicy.Layer{Source: l.source, Spec: runner.Policy, ServiceAccountName: floor.ServiceAccountName}
			if runner.Image != "" {
				defaultImage = runner.Image
			}
			if runner.ServiceAccountName != "" {
				floor.ServiceAccountName = runner.ServiceAccountName
			}
		default:
			ns = &runnerpolicy.Layer{Source: l.source, Spec: runner.Policy, ServiceAccountName: runner.ServiceAccountName}
		}
		if !imageSet && runner.Image != "" {
			imageSet, eff.RunnerImageField = true, fieldOf(l, "spec.runner.image", "spec.runner.image")
		}
		if !saSet && runner.ServiceAccountName != "" {
			saSet, eff.ServiceAccountField = true, fieldOf(l, "spec.serviceAccountName", "spec.runner.serviceAccountName")
		}
	}
	eff.RunnerPolicy, eff.RunnerPolicyNotes = runnerpolicy.Resolve(floor, ns, defaultImage)
}

// fieldOf names a field of the Stack, or of the config l is.
func fieldOf(l layer, stackField, configField string) string {
	if l.source == "" {
		return stackField
	}
	return configField + " of TerraceConfig " + l.source
}

// merger remembers which layers contributed while fields are picked.
type merger struct {
	layers  []layer
	used    []bool
	builtin bool
}

func (m *merger) sources() []string {
	var out []string
	for i, l := range m.layers {
		if i < len(m.used) && m.used[i] && l.source != "" {
			out = append(out, l.source)
		}
	}
	if m.builtin {
		out = append(out, BuiltinSource)
	}
	return out
}

func (m *merger) markUsed(i int) {
	if m.used == nil {
		m.used = make([]bool, len(m.layers))
	}
	m.used[i] = true
}

// pick returns the value of the first layer for which get reports it set,
// else fallback. get sees a spec whose Runner, State and Defaults are never nil.
func pick[T any](m *merger, fallback T, get func(*terracev1.TerraceConfigSpec) (T, bool)) T {
	for i, l := range m.layers {
		if v, ok := get(normalized(l.spec)); ok {
			m.markUsed(i)
			return v
		}
	}
	m.builtin = true
	return fallback
}

// pickRef is pick for a Secret reference: the first layer naming one wins,
// and the Secret is looked up in that layer's namespace.
func pickRef(m *merger, fallback *SecretKeyRef, defaultKey string, get func(*terracev1.TerraceConfigSpec) *terracev1.SecretKeyReference) *SecretKeyRef {
	for i, l := range m.layers {
		if ref := get(normalized(l.spec)); ref != nil && ref.Name != "" {
			m.markUsed(i)
			return &SecretKeyRef{Namespace: l.namespace, Name: ref.Name, Key: KeyOrDefault(ref.Key, defaultKey)}
		}
	}
	if fallback == nil {
		return nil
	}
	m.builtin = true
	c := *fallback
	return &c
}

var (
	emptyRunner   = &terracev1.RunnerConfig{}
	emptyState    = &terracev1.StateConfig{}
	emptyDefaults = &terracev1.StackDefaults{}
)

// normalized returns spec with nil sections replaced by empty ones, so
// getters need no nil checks. The shared empty sections are never written.
func normalized(spec *terracev1.TerraceConfigSpec) *terracev1.TerraceConfigSpec {
	s := *spec
	if s.Runner == nil {
		s.Runner = emptyRunner
	}
	if s.State == nil {
		s.State = emptyState
	}
	if s.Defaults == nil {
		s.Defaults = emptyDefaults
	}
	return &s
}

// mergeEnv appends extra to base; a variable of extra replaces the one of
// base with the same name, in place.
func mergeEnv(base, extra []corev1.EnvVar) []corev1.EnvVar {
	if len(extra) == 0 {
		return base
	}
	out := slices.Clone(base)
	for _, e := range extra {
		if i := slices.IndexFunc(out, func(b corev1.EnvVar) bool { return b.Name == e.Name }); i >= 0 {
			out[i] = *e.DeepCopy()
			continue
		}
		out = append(out, *e.DeepCopy())
	}
	return out
}

func ptrValue[T any](p *T) T {
	if p == nil {
		var zero T
		return zero
	}
	return *p
}
