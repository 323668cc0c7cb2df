package tf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/zclconf/go-cty/cty"
)

// lockFile is where init records the provider versions it selected.
const lockFile = ".terraform.lock.hcl"

var lockSchema = &hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{{Type: "provider", LabelNames: []string{"source"}}}}

var lockProviderSchema = &hcl.BodySchema{Attributes: []hcl.AttributeSchema{{Name: "version"}}}

// lockedProviders reads the provider versions init selected from the
// module's dependency lock file: what `version -json` reports as
// provider_selections, without another tofu process. A module without
// providers has no lock file.
func lockedProviders(moduleDir string) (map[string]string, error) {
	path := filepath.Join(moduleDir, lockFile)
	src, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("failed to read the dependency lock file: %w", err)
	}
	file, diags := hclparse.NewParser().ParseHCL(src, lockFile)
	if diags.HasErrors() {
		return nil, fmt.Errorf("failed to parse the dependency lock file: %s", diags.Error())
	}
	content, _, diags := file.Body.PartialContent(lockSchema)
	if diags.HasErrors() {
		return nil, fmt.Errorf("failed to parse the dependency lock file: %s", diags.Error())
	}
	out := map[string]string{}
	for _, block := range content.Blocks {
		attrs, _, _ := block.Body.PartialContent(lockProviderSchema)
		attr, ok := attrs.Attributes["version"]
		if !ok {
			continue
		}
		v, diags := attr.Expr.Value(nil)
		if diags.HasErrors() || v.Type() != cty.String || v.IsNull() {
			continue
		}
		out[block.Labels[0]] = v.AsString()
	}
	return out, nil
}
