// Package runnerpolicy decides which runner pods Stacks may ask for: the
// images, ServiceAccounts, volume types, env and placement their
// spec.runner and spec.serviceAccountName may name, and the labels and
// annotations no runner pod may carry. References lists the Secrets,
// ConfigMaps, claims and tokens a spec.runner names, which the Stack
// controller puts to the runner ServiceAccount's rights.
//
// The policy of the operator namespace's TerraceConfig is the floor for the
// cluster; a namespace's TerraceConfig may only narrow it. Resolve combines
// the two (reporting what a namespace config tried to widen) and Check
// refuses a runner pod that the combined policy does not allow, naming the
// field and the config that refuses it.
//
//	pol, notes := runnerpolicy.Resolve(floor, ns)
//	err := pol.Check(runnerpolicy.Pod{Template: stack.Spec.Runner, Image: img, ImageField: "spec.runner.image", ...})
package runnerpolicy

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// ProtectedServiceAccounts are Terrace's own accounts: the controller's and
// the Installations API server's. No runner may run as them, whatever a
// config says: they hold rights over every tenant's Stacks and callers.
var ProtectedServiceAccounts = []string{"terrace-api", "terrace-controller"}

// DefaultVolumeTypes are those the restricted Pod Security Standard allows.
var DefaultVolumeTypes = []string{"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}

// hostPath is never allowed: it reaches the node's filesystem.
const hostPath = "hostPath"

// BuiltinSource names the built-in defaults in messages.
const BuiltinSource = "the built-in runner policy"

// DefaultServiceAccountName is the runner's ServiceAccount when no config
// names one.
const DefaultServiceAccountName = "default"

// Layer is the policy one TerraceConfig sets.
type Layer struct {
	// Source names the config, e.g. "terrace-system/default", for messages.
	Source string
	// Spec is the config's spec.runner.policy; nil sets nothing.
	Spec *terracev1.RunnerPolicy
	// ServiceAccountName is the config's spec.runner.serviceAccountName:
	// the runner's account when a Stack names none ("" when it names none).
	ServiceAccountName string
}

// Patterns is one config's list of patterns; a name must match one of them.
type Patterns struct {
	Source   string   `json:"source"`
	Patterns []string `json:"patterns"`
}

// Note says what part of a config's policy does not take effect, and why.
type Note struct {
	// Source names the config the note is about.
	Source  string
	Message string
}

// Rule is a yes/no permission and, when no, who said so.
type Rule struct {
	Allowed bool `json:"allowed"`
	// DeniedBy names the config that denies it.
	DeniedBy string `json:"deniedBy,omitempty"`
}

// Policy is the effective runner policy of a namespace.
type Policy struct {
	// Images: an image must match a pattern of every entry (the floor's,
	// then the namespace's): that is what "only narrow" means for patterns.
	Images []Patterns `json:"images"`
	// ServiceAccounts: likewise; no entry means any name (Minimal only:
	// Resolve always sets one).
	ServiceAccounts []Patterns `json:"serviceAccounts,omitempty"`
	// DeniedServiceAccounts is Terrace's own accounts and every config's denials.
	DeniedServiceAccounts []string `json:"deniedServiceAccounts"`
	// VolumeTypes is the intersection of the layers' allowed types, sorted.
	VolumeTypes []string `json:"volumeTypes"`
	// VolumeTypesFrom names the configs that set VolumeTypes.
	VolumeTypesFrom []string `json:"-"`
	Env             Rule     `json:"env"`
	Placement       Rule     `json:"placement"`
	// OwnBackend: whether a Stack may keep its state in a backend of its own (spec.backend).
	OwnBackend Rule `json:"ownBackend"`
}

// Minimal is the policy that holds whatever the configs say: no hostPath,
// none of Terrace's own ServiceAccounts; everything else allowed. The
// launcher applies it when it is given no policy.
func Minimal() Policy {
	var types []string
	for _, t := range AllVolumeTypes() {
		if t != hostPath {
			types = append(types, t)
		}
	}
	return Policy{
		DeniedServiceAccounts: slices.Clone(ProtectedServiceAccounts),
		VolumeTypes:           types,
		VolumeTypesFrom:       []string{BuiltinSource},
		Env:                   Rule{Allowed: true},
		Placement:             Rule{Allowed: true},
		OwnBackend:            Rule{Allowed: true},
	}
}

// Resolve returns the policy of a namespace: floor is the operator
// namespace's config (its Spec may be nil), ns the namespace's own (nil
// when it has none, or when it is the operator namespace). defaultImage is
// the runner image the floor's Stacks get when nothing names one: it is the
// only image allowed when the floor names none. The notes say, one by one,
// what a config asked for that is not allowed (ns beyond the floor, hostPath
// anywhere).
//
// When no config lists allowedServiceAccounts, the only account allowed is
// the namespace's default runner account (the configs' serviceAccountName,
// nearest first, else "default"): a Stack author may not pick another
// account of the namespace, and with it that account's rights, unless an
// admin listed it. When only the namespace's config lists accounts, its
// list decides: its admin holds the namespace's RBAC and could grant the
// default account the same rights. A floor list bounds every namespace.
func Resolve(floor Layer, ns *Layer, defaultImage string) (Policy, []Note) {
	fs := spec(floor.Spec)
	p := Policy{
		Images:                []Patterns{{Source: floor.Source, Patterns: fs.AllowedImages}},
		DeniedServiceAccounts: slices.Clone(ProtectedServiceAccounts),
		VolumeTypes:           slices.Clone(DefaultVolumeTypes),
		VolumeTypesFrom:       []string{BuiltinSource},
		Env:                   rule(fs.AllowEnv, floor.Source),
		Placement:             rule(fs.AllowPlacement, floor.Source),
		OwnBackend:            rule(fs.AllowOwnBackend, floor.Source),
	}
	var notes []Note
	if len(fs.AllowedImages) == 0 {
		p.Images = []Patterns{{Source: BuiltinSource + " (only the default runner image)", Patterns: []string{defaultImage}}}
	}
	if len(fs.AllowedServiceAccounts) > 0 {
		p.ServiceAccounts = []Patterns{{Source: floor.Source, Patterns: fs.AllowedServiceAccounts}}
	}
	p.DeniedServiceAccounts = appendNew(p.DeniedServiceAccounts, fs.DeniedServiceAccounts...)
	if len(fs.AllowedVolumeTypes) > 0 {
		p.VolumeTypes, p.VolumeTypesFrom = volumeTypes(fs.AllowedVolumeTypes), []string{floor.Source}
		if slices.Contains(fs.AllowedVolumeTypes, hostPath) {
			notes = append(notes, Note{floor.Source, "allowedVolumeTypes: hostPath is never allowed and was dropped"})
		}
	}
	defaultSA := floor.ServiceAccountName
	if ns != nil {
		for _, msg := range p.narrow(*ns) {
			notes = append(notes, Note{ns.Source, msg})
		}
		if ns.ServiceAccountName != "" {
			defaultSA = ns.ServiceAccountName
		}
	}
	if defaultSA == "" {
		defaultSA = DefaultServiceAccountName
	}
	if len(p.ServiceAccounts) == 0 {
		p.ServiceAccounts = []Patterns{{Source: BuiltinSource + " (only the namespace's default runner ServiceAccount unless a TerraceConfig lists more)", Patterns: []string{defaultSA}}}
	}
	slices.Sort(p.VolumeTypes)
	return p, notes
}

// narrow applies a namespace config's policy on top of the floor.
func (p *Policy) narrow(ns Layer) []string {
	s := spec(ns.Spec)
	var notes []string
	if len(s.AllowedImages) > 0 {
		notes = append(notes, widening("allowedImages", s.AllowedImages, p.Images)...)
		p.Images = append(p.Images, Patterns{Source: ns.Source, Patterns: s.AllowedImages})
	}
	if len(s.AllowedServiceAccounts) > 0 {
		notes = append(notes, widening("allowedServiceAccounts", s.AllowedServiceAccounts, p.ServiceAccounts)...)
		p.ServiceAccounts = append(p.ServiceAccounts, Patterns{Source: ns.Source, Patterns: s.AllowedServiceAccounts})
	}
	p.DeniedServiceAccounts = appendNew(p.DeniedServiceAccounts, s.DeniedServiceAccounts...)
	if len(s.AllowedVolumeTypes) > 0 {
		want := volumeTypes(s.AllowedVolumeTypes)
		var kept []string
		for _, t := range want {
			if slices.Contains(p.VolumeTypes, t) {
				kept = append(kept, t)
			} else {
				notes = append(notes, fmt.Sprintf("allowedVolumeTypes: %s is not allowed by %s", t, strings.Join(p.VolumeTypesFrom, " and ")))
			}
		}
		if slices.Contains(s.AllowedVolumeTypes, hostPath) {
			notes = append(notes, "allowedVolumeTypes: hostPath is never allowed and was dropped")
		}
		p.VolumeTypes, p.VolumeTypesFrom = kept, append(p.VolumeTypesFrom, ns.Source)
	}
	p.Env, notes = narrowRule("allowEnv", p.Env, s.AllowEnv, ns.Source, notes)
	p.Placement, notes = narrowRule("allowPlacement", p.Placement, s.AllowPlacement, ns.Source, notes)
	p.OwnBackend, notes = narrowRule("allowOwnBackend", p.OwnBackend, s.AllowOwnBackend, ns.Source, notes)
	return notes
}

// widening reports the patterns of a namespace that no floor pattern
// covers (taken as a literal name, a pattern is within another when that one matches it). It is a report only: a name must match every layer anyway, so a
// wider pattern never allows more.
func widening(field string, patterns []string, floor []Patterns) []string {
	var notes []string
	for _, pat := range patterns {
		for _, layer := range floor {
			if !matchAny(layer.Patterns, pat) {
				notes = append(notes, fmt.Sprintf("%s: %q is not within %s (%s), so it allows only what both allow",
					field, pat, layer.Source, strings.Join(layer.Patterns, ", ")))
				break
			}
		}
	}
	return notes
}

func narrowRule(field string, floor Rule, ns *bool, source string, notes []string) (Rule, []string) {
	switch {
	case ns == nil:
		return floor, notes
	case !*ns:
		if floor.Allowed {
			return Rule{DeniedBy: source}, notes
		}
		return floor, notes
	case !floor.Allowed:
		return floor, append(notes, fmt.Sprintf("%s: true is ignored: %s does not allow it", field, floor.DeniedBy))
	}
	return floor, notes
}

func rule(allowed *bool, source string) Rule {
	if allowed == nil || *allowed {
		return Rule{Allowed: true}
	}
	return Rule{DeniedBy: source}
}

func spec(s *terracev1.RunnerPolicy) *terracev1.RunnerPolicy {
	if s == nil {
		return &terracev1.RunnerPolicy{}
	}
	return s
}

// volumeTypes returns the types without hostPath.
func volumeTypes(in []terracev1.VolumeType) []string {
	var out []string
	for _, t := range in {
		if t != hostPath && !slices.Contains(out, string(t)) {
			out = append(out, string(t))
		}
	}
	return out
}

func appendNew(list []string, items ...string) []string {
	for _, it := range items {
		if !slices.Contains(list, it) {
			list = append(list, it)
		}
	}
	return list
}

// AllVolumeTypes lists the volume sources of the pod API, by their JSON names.
func AllVolumeTypes() []string {
	t := reflect.TypeFor[corev1.VolumeSource]()
	out := make([]string, 0, t.NumField())
	for i := range t.NumField() {
		out = append(out, jsonName(t.Field(i)))
	}
	return out
}

// volumeType returns the JSON name of the source a volume uses ("" for none).
func volumeType(v *corev1.Volume) string {
	src := reflect.ValueOf(v.VolumeSource)
	for i := range src.NumField() {
		if f := src.Field(i); f.Kind() == reflect.Pointer && !f.IsNil() {
			return jsonName(src.Type().Field(i))
		}
	}
	return ""
}

func jsonName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	return name
}
