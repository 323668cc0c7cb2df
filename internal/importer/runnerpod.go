package importer

import (
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// runnerPodSpecFields are the fields of tofu-controller's RunnerPodSpec a
// Stack's spec.runner takes as they are (the same Kubernetes types).
var runnerPodSpecFields = map[string]bool{
	"env": true, "envFrom": true, "nodeSelector": true, "affinity": true, "tolerations": true,
	"volumeMounts": true, "volumes": true, "resources": true,
}

// runnerPodSpecReasons say why the other fields are not carried over.
var runnerPodSpecReasons = map[string]string{
	"image":             "tofu-controller's tf-runner image cannot run Terrace's runner: the Stack uses the TerraceConfig's runner image",
	"initContainers":    "runner pods have no init containers: bake what they prepared into the module or a volume",
	"hostAliases":       "runner pods take no host aliases: use DNS names the cluster resolves",
	"priorityClassName": "the runner pod's priority class is not a Stack field",
	"securityContext":   "the runner pod's security context is set by Terrace's launcher, not by the Stack",
}

func mapRunnerPodTemplate(c *converter, field string, v any) error {
	var tmpl struct {
		Metadata struct {
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
		Spec map[string]any `json:"spec"`
	}
	if err := decode(v, &tmpl); err != nil {
		return err
	}
	runner := map[string]any{}
	if len(tmpl.Metadata.Labels) > 0 {
		runner["labels"] = tmpl.Metadata.Labels
	}
	if len(tmpl.Metadata.Annotations) > 0 {
		runner["annotations"] = tmpl.Metadata.Annotations
	}
	keys := make([]string, 0, len(tmpl.Spec))
	for k := range tmpl.Spec {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		f := field + ".spec." + k
		switch {
		case runnerPodSpecFields[k]:
			runner[k] = tmpl.Spec[k]
		case runnerPodSpecReasons[k] != "":
			c.skip(f, "%s", runnerPodSpecReasons[k])
		default:
			c.skip(f, "not a field of tofu-controller's runner pod spec")
		}
	}
	if len(runner) == 0 {
		return nil
	}
	var out terracev1.RunnerPodTemplate
	if err := decode(runner, &out); err != nil {
		return fmt.Errorf("runner pod template: %w", err)
	}
	c.stack.Spec.Runner = &out
	return nil
}

// runnerFieldOf maps a runner policy violation's field (spec.runner.env,
// spec.runner.volumes[0].hostPath) to the Terraform field it came from.
func runnerFieldOf(stackField string) (terraformField, runnerKey string) {
	rest := stackField[len("spec.runner."):]
	key := rest
	for i, r := range rest {
		if r == '.' || r == '[' {
			key = rest[:i]
			break
		}
	}
	if key == "labels" || key == "annotations" {
		return "spec.runnerPodTemplate.metadata." + rest, key
	}
	return "spec.runnerPodTemplate.spec." + rest, key
}

// dropRunnerField removes one field from the Stack's spec.runner.
func dropRunnerField(t *terracev1.RunnerPodTemplate, key string) {
	switch key {
	case "env":
		t.Env = nil
	case "envFrom":
		t.EnvFrom = nil
	case "nodeSelector":
		t.NodeSelector = nil
	case "tolerations":
		t.Tolerations = nil
	case "affinity":
		t.Affinity = nil
	case "volumes":
		t.Volumes, t.VolumeMounts = nil, dropMountsOf(t.VolumeMounts, t.Volumes)
	case "volumeMounts":
		t.VolumeMounts = nil
	case "resources":
		t.Resources = nil
	case "labels":
		t.Labels = nil
	case "annotations":
		t.Annotations = nil
	case "image":
		t.Image = ""
	}
}

// dropMountsOf removes the mounts of removed volumes.
func dropMountsOf(mounts []corev1.VolumeMount, removed []corev1.Volume) []corev1.VolumeMount {
	gone := map[string]bool{}
	for _, v := range removed {
		gone[v.Name] = true
	}
	var kept []corev1.VolumeMount
	for _, m := range mounts {
		if !gone[m.Name] {
			kept = append(kept, m)
		}
	}
	return kept
}
