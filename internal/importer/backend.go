package importer

import (
	"fmt"
	"slices"
	"sort"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	ctyjson "github.com/zclconf/go-cty/cty/json"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/nesting"
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
// The source is a tenant's; one nested too deep for HCL's recursive
// parser is refused before it overflows the stack.
func parseBackendBlock(field, src string, c *converter) (*terracev1.StackBackend, error) {
	if err := nesting.CheckHCL([]byte(src), field); err != nil {
		return nil, err
	}
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

// backendEnv is, per backend type, the environment variable OpenTofu
// v1.12.6 reads for a backend attribute when the block leaves it unset
// (schema.EnvDefaultFunc in its backends; the AWS SDK's own for s3).
// Only these can carry a setting from a Secret without putting its value
// in the Stack.
var backendEnv = map[string]map[string]string{
	"pg": {"conn_str": "PG_CONN_STR", "schema_name": "PG_SCHEMA_NAME", "table_name": "PG_TABLE_NAME", "index_name": "PG_INDEX_NAME"},
	"s3": {"access_key": "AWS_ACCESS_KEY_ID", "secret_key": "AWS_SECRET_ACCESS_KEY", "token": "AWS_SESSION_TOKEN",
		"region": "AWS_REGION", "profile": "AWS_PROFILE", "role_arn": "AWS_ROLE_ARN", "custom_ca_bundle": "AWS_CA_BUNDLE"},
	"gcs": {"credentials": "GOOGLE_BACKEND_CREDENTIALS", "access_token": "GOOGLE_OAUTH_ACCESS_TOKEN",
		"encryption_key": "GOOGLE_ENCRYPTION_KEY", "kms_encryption_key": "GOOGLE_KMS_ENCRYPTION_KEY"},
	"azurerm": {"access_key": "ARM_ACCESS_KEY", "sas_token": "ARM_SAS_TOKEN", "client_id": "ARM_CLIENT_ID", "client_secret": "ARM_CLIENT_SECRET",
		"client_certificate_password": "ARM_CLIENT_CERTIFICATE_PASSWORD", "subscription_id": "ARM_SUBSCRIPTION_ID", "tenant_id": "ARM_TENANT_ID", "oidc_token": "ARM_OIDC_TOKEN"},
	"http": {"address": "TF_HTTP_ADDRESS", "lock_address": "TF_HTTP_LOCK_ADDRESS", "unlock_address": "TF_HTTP_UNLOCK_ADDRESS",
		"username": "TF_HTTP_USERNAME", "password": "TF_HTTP_PASSWORD", "client_certificate_pem": "TF_HTTP_CLIENT_CERTIFICATE_PEM",
		"client_private_key_pem": "TF_HTTP_CLIENT_PRIVATE_KEY_PEM", "client_ca_certificate_pem": "TF_HTTP_CLIENT_CA_CERTIFICATE_PEM"},
	"consul": {"ca_file": "CONSUL_CACERT", "cert_file": "CONSUL_CLIENT_CERT", "key_file": "CONSUL_CLIENT_KEY"},
}

// mapBackendConfigsFrom: tofu-controller passes each listed key of the
// Secret to `init` as -backend-config KEY=VALUE. Where the backend reads
// that attribute from an environment variable, the key becomes a
// spec.backend.credentials entry (and the attribute leaves
// spec.backend.config, which -backend-config overrode); anything else is
// listed with what to do instead. Runs after mapBackendConfig (keys are
// mapped in order), so spec.backend is known.
func mapBackendConfigsFrom(c *converter, field string, v any) error {
	var refs []struct {
		Kind     string   `json:"kind"`
		Name     string   `json:"name"`
		Keys     []string `json:"keys"`
		Optional bool     `json:"optional"`
	}
	if err := decode(v, &refs); err != nil {
		return err
	}
	b := c.stack.Spec.Backend
	for i, ref := range refs {
		at := fmt.Sprintf("%s[%d]", field, i)
		switch {
		case b == nil:
			c.skip(at, "settings of tofu-controller's kubernetes backend: the adopted state moves to Terrace's own store, which needs none")
			continue
		case ref.Kind != "Secret":
			c.skip(at, "%s %s: only Secrets become credentials; copy settings that are not secret into spec.backend.config", ref.Kind, ref.Name)
			continue
		case len(ref.Keys) == 0:
			c.skip(at, "Secret %s: no keys listed, and the importer does not read Secrets; list them in keys, or write spec.backend.credentials by hand", ref.Name)
			continue
		}
		if ref.Optional {
			c.skip(at+".optional", "Secret %s is required by spec.backend.credentials: a run fails without it", ref.Name)
		}
		for _, key := range ref.Keys {
			env, ok := backendEnv[b.Type][key]
			if !ok {
				c.skip(at+".keys", "backend %s reads no environment variable for %q: put it in spec.backend.config (readable by whoever reads the Stack) or in a file through spec.backend.credentials asFile and the backend's own file attribute", b.Type, key)
				continue
			}
			if slices.ContainsFunc(b.Credentials, func(cr terracev1.BackendCredential) bool { return cr.Env == env }) {
				c.skip(at+".keys", "%q: %s is already set from an earlier Secret, which tofu-controller's later one overrode; pick one in spec.backend.credentials", key, env)
				continue
			}
			delete(b.Config, key)
			b.Credentials = append(b.Credentials, terracev1.BackendCredential{Env: env, SecretKeyRef: terracev1.SecretKeyReference{Name: ref.Name, Key: key}})
		}
	}
	if b != nil && len(b.Config) == 0 {
		b.Config = nil
	}
	return nil
}
