package importer

import (
	"fmt"
	"sort"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	ctyjson "github.com/zclconf/go-cty/cty/json"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// mapBackendConfig: tofu-controller's default backend is the kubernetes
// one (a Secret tfstate-<workspace>-<suffix>), whose state is adopted; a
// custom backend block becomes spec.backend, keeping the state where it is.
func mapBackendConfig(c *converter, field string, v any) error {
	var bc struct {
		Disable             bool              `json:"disable"`
		SecretSuffix        string            `json:"secretSuffix"`
		InClusterConfig     bool              `json:"inClusterConfig"`
		CustomConfiguration string            `json:"customConfiguration"`
		ConfigPath          string            `json:"configPath"`
		Labels              map[string]string `json:"labels"`
	}
	if err := decode(v, &bc); err != nil {
		return err
	}
	c.backendSuffix = bc.SecretSuffix
	switch {
	case bc.Disable:
		c.stateless = true
		c.skip(field+".disable", "the state lived in the runner pod only: there is none to adopt, and the Stack's first plan creates everything")
	case bc.CustomConfiguration != "":
		b, err := parseBackendBlock(field+".customConfiguration", bc.CustomConfiguration, c)
		if err != nil {
			c.skip(field+".customConfiguration", "%v: write spec.backend by hand", err)
			return nil
		}
		c.ownBackend = true
		c.stack.Spec.Backend = b
	case bc.ConfigPath != "":
		c.skip(field+".configPath", "the state Secret is in the cluster of kubeconfig %s: adopt it from there with `terrace state adopt --kubeconfig`", bc.ConfigPath)
	}
	return nil
}

// parseBackendBlock reads `backend "TYPE" { attr = literal ... }`. Nested
// blocks and expressions that are not literals are listed, not guessed.
func parseBackendBlock(field, src string, c *converter) (*terracev1.StackBackend, error) {
	file, diags := hclsyntax.ParseConfig([]byte(src), field, hcl.InitialPos)
	if diags.HasErrors() {
		return nil, fmt.Errorf("not valid HCL: %s", diags.Error())
	}
	body := file.Body.(*hclsyntax.Body)
	var backend *hclsyntax.Block
	for _, blk := range body.Blocks {
		if blk.Type == "backend" && len(blk.Labels) == 1 && backend == nil {
			backend = blk
			continue
		}
		c.skip(field, "block %s is not the one backend block", blk.Type)
	}
	if backend == nil {
		return nil, fmt.Errorf("no backend \"TYPE\" { ... } block")
	}
	if backend.Labels[0] == "local" {
		return nil, fmt.Errorf("the local backend keeps state in the runner pod")
	}
	out := &terracev1.StackBackend{Type: backend.Labels[0]}
	names := make([]string, 0, len(backend.Body.Attributes))
	for name := range backend.Body.Attributes {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		val, diags := backend.Body.Attributes[name].Expr.Value(nil)
		if diags.HasErrors() {
			c.skip(field, "attribute %s is not a literal value (%s)", name, diags.Error())
			continue
		}
		raw, err := ctyjson.Marshal(val, val.Type())
		if err != nil {
			c.skip(field, "attribute %s: %v", name, err)
			continue
		}
		if out.Config == nil {
			out.Config = map[string]apiextensionsv1.JSON{}
		}
		out.Config[name] = apiextensionsv1.JSON{Raw: raw}
	}
	for _, blk := range backend.Body.Blocks {
		c.skip(field, "nested block %s of the backend is not carried over: spec.backend.config takes attributes only", blk.Type)
	}
	return out, nil
}
