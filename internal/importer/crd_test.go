package importer

import (
	"encoding/json"
	"os"
	"slices"
	"sort"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// tofuControllerCRD is tofu-controller's published CRD (testdata/tofu-controller/SOURCE.md).
const tofuControllerCRD = "testdata/tofu-controller/infra.contrib.fluxcd.io_terraforms.yaml"

func loadTofuControllerCRD(t *testing.T) *apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	raw, err := os.ReadFile(tofuControllerCRD)
	if err != nil {
		t.Fatal(err)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.Unmarshal(raw, crd); err != nil {
		t.Fatal(err)
	}
	return crd
}

func specProperties(t *testing.T, crd *apiextensionsv1.CustomResourceDefinition, version string) map[string]apiextensionsv1.JSONSchemaProps {
	t.Helper()
	for _, v := range crd.Spec.Versions {
		if v.Name == version {
			return v.Schema.OpenAPIV3Schema.Properties["spec"].Properties
		}
	}
	t.Fatalf("the CRD has no version %s", version)
	return nil
}

// Every field of the real v1alpha2 spec has a mapper (which maps it or says
// why not), and no mapper is for a field the CRD does not have.
func TestEveryTerraformSpecFieldIsHandled(t *testing.T) {
	crd := loadTofuControllerCRD(t)
	if crd.Spec.Group != TerraformGroup || crd.Spec.Names.Kind != TerraformKind {
		t.Fatalf("CRD is %s %s", crd.Spec.Group, crd.Spec.Names.Kind)
	}
	props := specProperties(t, crd, TerraformVersion)
	var missing, extra []string
	for name := range props {
		if _, ok := specFields[name]; !ok {
			missing = append(missing, name)
		}
	}
	for name := range specFields {
		if _, ok := props[name]; !ok {
			extra = append(extra, name)
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	if len(missing) > 0 || len(extra) > 0 {
		t.Fatalf("spec fields without a mapper: %v; mappers of fields the CRD lacks: %v", missing, extra)
	}
}

// The runner pod template's spec fields are each copied or refused with a
// reason, and metadata carries labels and annotations only.
func TestEveryRunnerPodSpecFieldIsHandled(t *testing.T) {
	props := specProperties(t, loadTofuControllerCRD(t), TerraformVersion)
	tmpl := props["runnerPodTemplate"].Properties
	for name := range tmpl["spec"].Properties {
		if !runnerPodSpecFields[name] && runnerPodSpecReasons[name] == "" {
			t.Errorf("runnerPodTemplate.spec.%s is neither copied nor refused with a reason", name)
		}
	}
	var meta []string
	for name := range tmpl["metadata"].Properties {
		meta = append(meta, name)
	}
	sort.Strings(meta)
	if !slices.Equal(meta, []string{"annotations", "labels"}) {
		t.Errorf("runnerPodTemplate.metadata has %v", meta)
	}
}

// An object as the API server stores it, with the real CRD's defaults
// filled in, lists nothing: defaults are no one's choice.
func TestCRDDefaultsAreNotListed(t *testing.T) {
	fields := map[string]any{}
	for name, p := range specProperties(t, loadTofuControllerCRD(t), TerraformVersion) {
		if p.Default != nil {
			var v any
			if err := json.Unmarshal(p.Default.Raw, &v); err != nil {
				t.Fatal(err)
			}
			fields[name] = v
		}
		for sub, sp := range p.Properties {
			if sp.Default == nil {
				continue
			}
			var v any
			if err := json.Unmarshal(sp.Default.Raw, &v); err != nil {
				t.Fatal(err)
			}
			obj, _ := fields[name].(map[string]any)
			if obj == nil {
				obj = map[string]any{}
			}
			obj[sub] = v
			fields[name] = obj
		}
	}
	if len(fields) < 10 {
		t.Fatalf("found only these defaults in the CRD: %v", fields)
	}
	r, err := Convert(terraform(fields), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Unmapped) != 0 {
		t.Errorf("defaults listed as not mapped: %s", listReasons(r))
	}
	if r.RunOptions != nil {
		t.Errorf("defaults written as run options: %v", r.RunOptions)
	}
	if r.Stack.Spec.ServiceAccountName != "tf-runner" || r.Stack.Spec.MaxRetryInterval == nil {
		t.Errorf("defaults that do map: %+v", r.Stack.Spec)
	}
}
