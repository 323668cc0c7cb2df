package runnerpolicy

import (
	"fmt"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// Pod is what a runner pod would be made from, and where each choice came
// from (the fields name it in violations).
type Pod struct {
	// Template is the Stack's spec.runner; nil when it sets none.
	Template *terracev1.RunnerPodTemplate
	// Image is the runner image the pod would run.
	Image string
	// ImageField says where Image came from: "spec.runner.image", or a
	// TerraceConfig's field, or the controller's default.
	ImageField string
	// ServiceAccountName is the account the pod would run as.
	ServiceAccountName string
	// ServiceAccountField says where ServiceAccountName came from.
	ServiceAccountField string
	// OwnBackend is the type of the Stack's spec.backend; "" when it keeps
	// its state on Terrace's state server.
	OwnBackend string
}

// Violation is one part of a runner pod the policy refuses.
type Violation struct {
	// Field is the refused field, e.g. spec.runner.volumes[0].hostPath.
	Field string
	// Reason says which rule, of which config, refuses it.
	Reason string
}

// Violations is every part of a runner pod the policy refuses.
type Violations []Violation

func (v Violations) Error() string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = x.Field + ": " + x.Reason
	}
	return "the runner policy refuses " + strings.Join(parts, "; ") +
		" (change the Stack, or ask for the TerraceConfig's spec.runner.policy to allow it)"
}

// Fields lists the refused fields.
func (v Violations) Fields() []string {
	out := make([]string, len(v))
	for i, x := range v {
		out[i] = x.Field
	}
	return out
}

// Check returns Violations when the policy refuses pod, nil otherwise.
func (p Policy) Check(pod Pod) error {
	var out Violations
	add := func(field, format string, args ...any) {
		out = append(out, Violation{Field: field, Reason: fmt.Sprintf(format, args...)})
	}
	p.checkImage(pod, add)
	p.checkServiceAccount(pod, add)
	if pod.OwnBackend != "" && !p.OwnBackend.Allowed {
		add("spec.backend", "a backend of the Stack's own (%s) may not be used: %s sets allowOwnBackend: false", pod.OwnBackend, p.OwnBackend.DeniedBy)
	}
	if t := pod.Template; t != nil {
		p.checkVolumes(t, add)
		p.checkEnv(t, add)
		p.checkPlacement(t, add)
		p.checkReferences(pod, add)
		checkMetadata(t.Labels, t.Annotations, add)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

type addFunc func(field, format string, args ...any)

func (p Policy) checkImage(pod Pod, add addFunc) {
	if _, err := name.ParseReference(pod.Image); err != nil {
		add(pod.ImageField, "%q is not a valid image reference", pod.Image)
		return
	}
	for _, layer := range p.Images {
		if !matchAny(layer.Patterns, pod.Image) {
			add(pod.ImageField, "image %q is not allowed by %s (allowedImages: %s)", pod.Image, layer.Source, strings.Join(layer.Patterns, ", "))
			return
		}
	}
}

func (p Policy) checkServiceAccount(pod Pod, add addFunc) {
	sa := pod.ServiceAccountName
	if slices.Contains(p.DeniedServiceAccounts, sa) {
		if slices.Contains(ProtectedServiceAccounts, sa) {
			add(pod.ServiceAccountField, "ServiceAccount %q is one of Terrace's own and never runs a runner", sa)
			return
		}
		add(pod.ServiceAccountField, "ServiceAccount %q is denied (deniedServiceAccounts)", sa)
		return
	}
	for _, layer := range p.ServiceAccounts {
		if !matchAny(layer.Patterns, sa) {
			add(pod.ServiceAccountField, "ServiceAccount %q is not allowed by %s (allowedServiceAccounts: %s)", sa, layer.Source, strings.Join(layer.Patterns, ", "))
			return
		}
	}
}

func (p Policy) checkVolumes(t *terracev1.RunnerPodTemplate, add addFunc) {
	for i := range t.Volumes {
		typ := volumeType(&t.Volumes[i])
		field := fmt.Sprintf("spec.runner.volumes[%d]", i)
		switch {
		case typ == "":
			add(field, "volume %q names no volume source", t.Volumes[i].Name)
		case typ == hostPath:
			add(field+"."+typ, "hostPath volumes are never allowed: they reach the node's filesystem")
		case !slices.Contains(p.VolumeTypes, typ):
			add(field+"."+typ, "volume type %s is not allowed by %s (allowedVolumeTypes: %s)", typ, strings.Join(p.VolumeTypesFrom, " and "), strings.Join(p.VolumeTypes, ", "))
		}
	}
}

func (p Policy) checkEnv(t *terracev1.RunnerPodTemplate, add addFunc) {
	if p.Env.Allowed {
		return
	}
	if len(t.Env) > 0 {
		add("spec.runner.env", "env may not be set: %s sets allowEnv: false", p.Env.DeniedBy)
	}
	for i, e := range t.EnvFrom {
		field := fmt.Sprintf("spec.runner.envFrom[%d]", i)
		switch {
		case e.SecretRef != nil:
			field += ".secretRef"
		case e.ConfigMapRef != nil:
			field += ".configMapRef"
		}
		add(field, "envFrom may not be set: %s sets allowEnv: false", p.Env.DeniedBy)
	}
	// A Secret in a file reaches module code as surely as one in env.
	for _, field := range secretVolumeFields(t) {
		add(field, "Secrets and tokens may not be mounted: %s sets allowEnv: false", p.Env.DeniedBy)
	}
}

func (p Policy) checkPlacement(t *terracev1.RunnerPodTemplate, add addFunc) {
	if p.Placement.Allowed {
		return
	}
	if len(t.NodeSelector) > 0 {
		add("spec.runner.nodeSelector", "placement may not be set: %s sets allowPlacement: false", p.Placement.DeniedBy)
	}
	if len(t.Tolerations) > 0 {
		add("spec.runner.tolerations", "placement may not be set: %s sets allowPlacement: false", p.Placement.DeniedBy)
	}
	if t.Affinity != nil {
		add("spec.runner.affinity", "placement may not be set: %s sets allowPlacement: false", p.Placement.DeniedBy)
	}
}
