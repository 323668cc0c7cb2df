package devcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// FieldManager owns what `terrace dev --demo` applies.
const FieldManager = "terrace-dev"

// Applied is one object applied from a manifest.
type Applied struct {
	Object   *unstructured.Unstructured
	Resource schema.GroupVersionResource
	// Source is the file it came from.
	Source string
}

// Ref names the object as kind namespace/name.
func (a Applied) Ref() string {
	if ns := a.Object.GetNamespace(); ns != "" {
		return fmt.Sprintf("%s %s/%s", a.Object.GetKind(), ns, a.Object.GetName())
	}
	return fmt.Sprintf("%s %s", a.Object.GetKind(), a.Object.GetName())
}

// ReadManifests decodes every object in the .yaml/.yml/.json files under
// dir (recursively, in path order). Kustomize files and empty documents are
// skipped.
func ReadManifests(dir string) ([]Applied, error) {
	return readManifests(dir, true)
}

// ReadManifestFiles is ReadManifests of dir's own files only, as
// `kubectl apply -f dir` reads them: subdirectories are left out.
func ReadManifestFiles(dir string) ([]Applied, error) {
	return readManifests(dir, false)
}

func readManifests(dir string, recursive bool) ([]Applied, error) {
	var out []Applied
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != dir && !recursive {
			return filepath.SkipDir
		}
		ext := strings.ToLower(filepath.Ext(path))
		if d.IsDir() || (ext != ".yaml" && ext != ".yml" && ext != ".json") {
			return nil
		}
		objs, err := decodeObjects(path)
		if err != nil {
			return err
		}
		for _, o := range objs {
			out = append(out, Applied{Object: o, Source: path})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("failed to read manifests: %w", err)
	}
	return out, nil
}

func decodeObjects(path string) ([]*unstructured.Unstructured, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	var out []*unstructured.Unstructured
	for {
		var raw map[string]any
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("failed to decode %s: %w", path, err)
		}
		u := &unstructured.Unstructured{Object: raw}
		if len(raw) == 0 || u.GetKind() == "" || u.GetAPIVersion() == "" || u.GetKind() == "Kustomization" {
			continue
		}
		out = append(out, u)
	}
}

// applyOrder puts what others depend on first.
var applyOrder = map[string]int{
	"Namespace": 0, "CustomResourceDefinition": 1, "ServiceAccount": 2, "ClusterRole": 3, "Role": 3,
	"ClusterRoleBinding": 4, "RoleBinding": 4, "Secret": 5, "ConfigMap": 5, "TerraceConfig": 6,
	"Program": 7, "Stack": 9,
}

func orderOf(kind string) int {
	if o, ok := applyOrder[kind]; ok {
		return o
	}
	return 8
}

// Apply creates the namespaces the objects use and server-side applies the
// objects in dependency order, filling in each one's resource and, for a
// namespaced object without one, the default namespace.
func Apply(ctx context.Context, cfg *rest.Config, objs []Applied, progress func(string)) error {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return fmt.Errorf("failed to create discovery client: %w", err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("failed to create dynamic client: %w", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("failed to create clientset: %w", err)
	}
	sort.SliceStable(objs, func(i, j int) bool { return orderOf(objs[i].Object.GetKind()) < orderOf(objs[j].Object.GetKind()) })

	for i := range objs {
		o := objs[i].Object
		gvk := o.GroupVersionKind()
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if meta.IsNoMatchError(err) {
			// A CRD applied just before: refresh discovery once.
			mapper.Reset()
			mapping, err = mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		}
		if err != nil {
			return fmt.Errorf("failed to find the resource of %s (%s): %w", objs[i].Ref(), objs[i].Source, err)
		}
		objs[i].Resource = mapping.Resource
		var ri dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			if o.GetNamespace() == "" {
				o.SetNamespace(corev1.NamespaceDefault)
			}
			if err := ensureNamespace(ctx, cs, o.GetNamespace(), progress); err != nil {
				return err
			}
			ri = dyn.Resource(mapping.Resource).Namespace(o.GetNamespace())
		}
		applied, err := ri.Apply(ctx, o.GetName(), o, metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
		if err != nil {
			return fmt.Errorf("failed to apply %s from %s: %w", objs[i].Ref(), objs[i].Source, err)
		}
		objs[i].Object = applied
		progress(fmt.Sprintf("applied %s (%s)", objs[i].Ref(), objs[i].Source))
	}
	return nil
}

func ensureNamespace(ctx context.Context, cs kubernetes.Interface, name string, progress func(string)) error {
	_, err := cs.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
	if err == nil {
		return nil
	}
	if !apierrors.IsNotFound(err) {
		return fmt.Errorf("failed to get namespace %s: %w", name, err)
	}
	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("failed to create namespace %s: %w", name, err)
	}
	progress("created namespace " + name)
	return nil
}
