package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/importer"
	"github.com/terrace-dev/terrace/internal/settings"
	"github.com/terrace-dev/terrace/internal/version"
)

func newImportCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "import",
		Short: "Write Stacks equivalent to another tool's objects",
	}
	cmd.AddCommand(newImportTofuControllerCommand())
	return cmd
}

// importFlags are the flags of `terrace import tofu-controller`.
type importFlags struct {
	kube          kubeFlags
	files         []string
	allNamespaces bool
	output        string
	adoptState    bool
	keepSuspend   bool
}

func newImportTofuControllerCommand() *cobra.Command {
	var f importFlags
	cmd := &cobra.Command{
		Use:   "tofu-controller",
		Short: "Write a Stack for each tofu-controller Terraform object, and adopt its state",
		Long: "Reads Terraform objects (infra.contrib.fluxcd.io/v1alpha2) from the cluster, or from files with -f,\n" +
			"and writes an equivalent Stack for each, kept within the namespace's runner policy. Every field that\n" +
			"is not carried over is listed, per object, on stderr and as comments in the output.\n" +
			"With --adopt-state each object's state Secret (tfstate-<workspace>-<name>) is copied, verified, into\n" +
			"the Stack's state, so its first plan shows no changes. Suspend the Terraform objects first.",
		Example: "  terrace import tofu-controller -n team -o stacks.yaml --adopt-state\n" +
			"  terrace import tofu-controller -f terraform.yaml -n team > stacks.yaml",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := commandContext(cmd)
			defer cancel()
			return runImport(ctx, f, streams{out: cmd.OutOrStdout(), err: cmd.ErrOrStderr()})
		},
	}
	f.kube.bind(cmd.Flags())
	cmd.Flags().StringArrayVarP(&f.files, "filename", "f", nil, "read Terraform objects from this YAML/JSON file (- for stdin) instead of the cluster; repeatable")
	cmd.Flags().BoolVarP(&f.allNamespaces, "all-namespaces", "A", false, "read Terraform objects of every namespace")
	cmd.Flags().StringVarP(&f.output, "output", "o", "", "write the Stacks to this file (default: stdout)")
	cmd.Flags().BoolVar(&f.adoptState, "adopt-state", false, "adopt each object's tofu-controller state Secret into its Stack's state")
	cmd.Flags().BoolVar(&f.keepSuspend, "keep-suspend", false, "copy spec.suspend (by default the Stacks are not suspended)")
	return cmd
}

func runImport(ctx context.Context, f importFlags, s streams) error {
	k, connectErr := f.kube.connect()
	if connectErr != nil && (len(f.files) == 0 || f.adoptState) {
		return connectErr
	}
	objects, err := readTerraformObjects(ctx, f, k)
	if err != nil {
		return err
	}
	if len(objects) == 0 {
		return errors.New("no Terraform objects found")
	}
	var results []importer.Result
	for _, obj := range objects {
		res, err := importer.Convert(obj, importer.Options{KeepSuspend: f.keepSuspend})
		if err != nil {
			return err
		}
		if k == nil {
			fmt.Fprintf(s.err, "warning: %s: no cluster to read the runner policy from: the Stack is not checked against it\n", res.Source)
		} else if err := res.ApplyPolicy(policyCheck(ctx, k)); err != nil {
			return fmt.Errorf("Terraform %s: %w", res.Source, err)
		}
		results = append(results, res)
	}
	importer.WriteReport(s.err, results)
	if f.adoptState {
		if err := adoptAll(ctx, k, results, s); err != nil {
			return err
		}
	}
	return writeStacks(f.output, s.out, results)
}

// readTerraformObjects reads -f files, or lists the cluster; objects
// without a namespace get the command's.
func readTerraformObjects(ctx context.Context, f importFlags, k *kube) ([]*unstructured.Unstructured, error) {
	namespace := f.kube.namespace
	if k != nil {
		namespace = k.namespace
	}
	if len(f.files) == 0 {
		ns := namespace
		if f.allNamespaces {
			ns = ""
		}
		return importer.ListObjects(ctx, k.client, ns)
	}
	var out []*unstructured.Unstructured
	for _, name := range f.files {
		objs, err := readObjectsFile(name)
		if err != nil {
			return nil, err
		}
		out = append(out, objs...)
	}
	for _, obj := range out {
		if obj.GetNamespace() == "" {
			obj.SetNamespace(namespace)
		}
	}
	return out, nil
}

func readObjectsFile(name string) ([]*unstructured.Unstructured, error) {
	var r io.Reader = os.Stdin
	if name != "-" {
		file, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		defer file.Close()
		r = file
	}
	objs, err := importer.ReadObjects(r)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return objs, nil
}

// policyCheck checks a Stack against the runner policy of its namespace.
func policyCheck(ctx context.Context, k *kube) importer.PolicyCheck {
	resolver := &settings.Resolver{Reader: k.client, OperatorNamespace: k.flags.operatorNamespace, Builtin: settings.BuiltinDefaults(version.ImageReference())}
	return func(stack *terracev1.Stack) error {
		eff, err := resolver.Resolve(ctx, stack)
		if err != nil {
			return err
		}
		return eff.CheckRunner(stack)
	}
}

// adoptAll adopts every object's state into its namespace's state store.
func adoptAll(ctx context.Context, k *kube, results []importer.Result, s streams) error {
	b := k.backends()
	defer b.Close()
	var failed []error
	for _, r := range results {
		set, err := b.For(ctx, r.Stack.Namespace)
		if err != nil {
			return fmt.Errorf("failed to open the stores of namespace %s: %w", r.Stack.Namespace, err)
		}
		res, err := importer.AdoptState(ctx, k.client, r, set.States)
		switch {
		case errors.Is(err, importer.ErrNoStateToAdopt):
			fmt.Fprintf(s.err, "%s: no state Secret to adopt (its state stays in spec.backend, or it had none)\n", r.Source)
		case err != nil:
			failed = append(failed, err)
		default:
			verb := "adopted"
			if res.AlreadyAdopted {
				verb = "already adopted"
			}
			fmt.Fprintf(s.err, "%s: %s Secret %s (serial %d, lineage %s)\n", r.Source, verb, r.StateSecret, res.Meta.Serial, res.Meta.Lineage)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("state adoption failed (fix it and run the command again; adoption is safe to repeat): %w", errors.Join(failed...))
	}
	return nil
}

func writeStacks(path string, stdout io.Writer, results []importer.Result) error {
	if path == "" {
		return importer.WriteYAML(stdout, results)
	}
	file, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := importer.WriteYAML(file, results); err != nil {
		file.Close()
		return err
	}
	return file.Close()
}
