package importer

import (
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// fieldMapper maps one spec field of a Terraform object onto the Stack.
type fieldMapper func(c *converter, field string, value any) error

// specFields has an entry for every field of tofu-controller's v1alpha2
// TerraformSpec (api/v1alpha2/terraform_types.go).
var specFields = map[string]fieldMapper{
	"approvePlan":                         mapApprovePlan,
	"destroy":                             mapDestroy,
	"backendConfig":                       mapBackendConfig,
	"backendConfigsFrom":                  mapBackendConfigsFrom,
	"cloud":                               unmappedIfSet("Terraform Cloud / HCP workspaces are not run by Terrace: use spec.backend with the remote backend, or keep this object"),
	"workspace":                           mapWorkspace,
	"vars":                                mapVars,
	"varsFrom":                            mapVarsFrom,
	"values":                              mapValues,
	"tfVarsFiles":                         runOption("varsFiles"),
	"fileMappings":                        runOption("fileMappings"),
	"interval":                            mapDuration(func(s *terracev1.StackSpec, d *metav1.Duration) { s.Interval = d }),
	"retryInterval":                       mapDuration(func(s *terracev1.StackSpec, d *metav1.Duration) { s.RetryInterval = d }),
	"retryStrategy":                       mapRetryStrategy,
	"maxRetryInterval":                    mapDuration(func(s *terracev1.StackSpec, d *metav1.Duration) { s.MaxRetryInterval = d }),
	"path":                                mapPath,
	"sourceRef":                           mapSourceRef,
	"suspend":                             mapBool(func(s *terracev1.StackSpec, b bool) { s.Suspend = b }),
	"force":                               unmappedIfTrue("a forced re-apply is not a Stack field: annotate the Stack with terrace.dev/requestedAt, or run `terrace replan`"),
	"readInputsFromSecrets":               unmappedIfSet("outputs Secrets of other Terraform objects are not read as one map variable: list them in spec.varsFrom (each key becomes a variable)"),
	"writeOutputsToSecret":                mapWriteOutputs,
	"disableDriftDetection":               mapDisableDriftDetection,
	"cliConfigSecretRef":                  unmappedIfSet("the runner's CLI configuration is Terrace's (provider mirrors and credentials are set in the TerraceConfig)"),
	"healthChecks":                        mapHealthChecks,
	"destroyResourcesOnDeletion":          mapBool(func(s *terracev1.StackSpec, b bool) { s.DestroyOnDelete = b }),
	"serviceAccountName":                  mapServiceAccount,
	"alwaysCleanupRunnerPod":              unmappedIfFalse("runner pods are kept per namespace, not per Stack: set spec.runner.retain in the TerraceConfig"),
	"runnerTerminationGracePeriodSeconds": unmappedUnless(int64(30), "the runner pod's grace period is Terrace's: a run is interrupted with SIGINT so tofu releases its lock"),
	"upgradeOnInit":                       ignoredBool, // true is tofu-controller's default: the difference is in docs/migrating-from-tofu-controller.md
	"refreshBeforeApply":                  unmappedIfTrue("Terrace applies exactly the saved plan; a refresh happens at plan time"),
	"runnerPodTemplate":                   mapRunnerPodTemplate,
	"enableInventory":                     mapEnableInventory,
	"tfstate":                             mapTFState,
	"targets":                             runOption("targets"),
	"parallelism":                         runOption("parallelism"),
	"storeReadablePlan":                   mapStoreReadablePlan,
	"plan":                                unmappedIfSet("plans always lock the state"),
	"webhooks":                            unmappedIfSet("post-planning webhooks are not run: check plans with a Rego policy in the TerraceConfig"),
	"dependsOn":                           mapDependsOn,
	"enterprise":                          unmappedIfSet("Weave GitOps Enterprise settings have no Terrace equivalent"),
	"planOnly":                            mapBool(func(s *terracev1.StackSpec, b bool) { s.PlanOnly = b }),
	"breakTheGlass":                       unmappedIfTrue("there is no break-the-glass mode: suspend the Stack and run tofu yourself"),
	"branchPlanner":                       unmappedIfSet("the branch planner has no Terrace equivalent"),
	"remediation":                         unmappedIfSet("failed runs are retried with backoff up to spec.maxRetryInterval, without a retry limit"),
}

func runtimeTypeMeta() metav1.TypeMeta {
	return metav1.TypeMeta{APIVersion: terracev1.GroupVersion.String(), Kind: "Stack"}
}

// objectMeta keeps the name, namespace, labels and annotations (not
// kubectl's or Flux's bookkeeping).
func objectMeta(obj *unstructured.Unstructured) metav1.ObjectMeta {
	meta := metav1.ObjectMeta{Name: obj.GetName(), Namespace: obj.GetNamespace(), Labels: obj.GetLabels()}
	for k, v := range obj.GetAnnotations() {
		if k == "kubectl.kubernetes.io/last-applied-configuration" || strings.HasPrefix(k, "reconcile.fluxcd.io/") {
			continue
		}
		if meta.Annotations == nil {
			meta.Annotations = map[string]string{}
		}
		meta.Annotations[k] = v
	}
	return meta
}

func unmappedIfSet(reason string) fieldMapper {
	return func(c *converter, field string, v any) error {
		if v != nil && !isEmpty(v) {
			c.skip(field, "%s", reason)
		}
		return nil
	}
}

// unmappedUnless lists a field whose value is not tofu-controller's
// default: the API server writes defaults into every object, and a value
// nobody chose is not worth a line per object.
func unmappedUnless(def any, reason string) fieldMapper {
	return func(c *converter, field string, v any) error {
		if v != nil && fmt.Sprint(v) != fmt.Sprint(def) {
			c.skip(field, "%s", reason)
		}
		return nil
	}
}

// ignoredBool checks the type of a field that maps to nothing.
func ignoredBool(_ *converter, _ string, v any) error {
	if _, ok := v.(bool); !ok {
		return fmt.Errorf("want a boolean, got %T", v)
	}
	return nil
}

func unmappedIfTrue(reason string) fieldMapper {
	return func(c *converter, field string, v any) error {
		b, ok := v.(bool)
		if !ok {
			return fmt.Errorf("want a boolean, got %T", v)
		}
		if b {
			c.skip(field, "%s", reason)
		}
		return nil
	}
}

func unmappedIfFalse(reason string) fieldMapper {
	return func(c *converter, field string, v any) error {
		b, ok := v.(bool)
		if !ok {
			return fmt.Errorf("want a boolean, got %T", v)
		}
		if !b {
			c.skip(field, "%s", reason)
		}
		return nil
	}
}

func isEmpty(v any) bool {
	switch t := v.(type) {
	case map[string]any:
		return len(t) == 0
	case []any:
		return len(t) == 0
	case string:
		return t == ""
	case bool:
		return !t
	case float64:
		return t == 0
	case int64:
		return t == 0
	case int:
		return t == 0
	}
	return false
}

// runOption copies a field under another name, as plain YAML: the Stack's
// run options are defined outside this package.
func runOption(name string) fieldMapper {
	return func(c *converter, _ string, v any) error {
		if !isEmpty(v) {
			c.runOptions[name] = v
		}
		return nil
	}
}

func mapBool(set func(*terracev1.StackSpec, bool)) fieldMapper {
	return func(c *converter, _ string, v any) error {
		b, ok := v.(bool)
		if !ok {
			return fmt.Errorf("want a boolean, got %T", v)
		}
		set(&c.stack.Spec, b)
		return nil
	}
}

func mapDuration(set func(*terracev1.StackSpec, *metav1.Duration)) fieldMapper {
	return func(c *converter, _ string, v any) error {
		s, ok := v.(string)
		if !ok {
			return fmt.Errorf("want a duration string, got %T", v)
		}
		d, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		if d <= 0 {
			return fmt.Errorf("duration %s is not positive", s)
		}
		set(&c.stack.Spec, &metav1.Duration{Duration: d})
		return nil
	}
}

func stringValue(v any) (string, error) {
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("want a string, got %T", v)
	}
	return s, nil
}
