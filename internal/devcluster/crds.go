package devcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// InstallCRDs creates or updates every CustomResourceDefinition found in the
// YAML files of dirs and waits until each is Established.
func (c *Cluster) InstallCRDs(ctx context.Context, dirs ...string) error {
	crds, err := ReadCRDs(dirs...)
	if err != nil {
		return err
	}
	return InstallCRDs(ctx, apiextensionsclient.NewForConfigOrDie(c.Config), crds)
}

// ReadCRDs decodes the CustomResourceDefinitions in the .yaml/.yml/.json
// files of dirs, in file-name order.
func ReadCRDs(dirs ...string) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	var out []*apiextensionsv1.CustomResourceDefinition
	for _, dir := range dirs {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return nil, fmt.Errorf("failed to read CRD directory: %w", err)
		}
		sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
		for _, e := range entries {
			ext := strings.ToLower(filepath.Ext(e.Name()))
			if e.IsDir() || (ext != ".yaml" && ext != ".yml" && ext != ".json") {
				continue
			}
			path := filepath.Join(dir, e.Name())
			crds, err := decodeCRDs(path)
			if err != nil {
				return nil, err
			}
			out = append(out, crds...)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no CustomResourceDefinitions found in %s", strings.Join(dirs, ", "))
	}
	return out, nil
}

func decodeCRDs(path string) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("failed to open %s: %w", path, err)
	}
	defer func() { _ = f.Close() }()
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	var out []*apiextensionsv1.CustomResourceDefinition
	for {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := dec.Decode(crd); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("failed to decode %s: %w", path, err)
		}
		if crd.Kind == "CustomResourceDefinition" && crd.Name != "" {
			out = append(out, crd)
		}
	}
}

// InstallCRDs creates or updates crds and waits until each is Established.
func InstallCRDs(ctx context.Context, cs apiextensionsclient.Interface, crds []*apiextensionsv1.CustomResourceDefinition) error {
	api := cs.ApiextensionsV1().CustomResourceDefinitions()
	for _, crd := range crds {
		_, err := api.Create(ctx, crd, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			current, getErr := api.Get(ctx, crd.Name, metav1.GetOptions{})
			if getErr != nil {
				return fmt.Errorf("failed to get CRD %s: %w", crd.Name, getErr)
			}
			crd.ResourceVersion = current.ResourceVersion
			_, err = api.Update(ctx, crd, metav1.UpdateOptions{})
		}
		if err != nil {
			return fmt.Errorf("failed to install CRD %s: %w", crd.Name, err)
		}
	}
	ticker := time.NewTicker(100 * time.Millisecond)
	defer ticker.Stop()
	for _, crd := range crds {
		for {
			current, err := api.Get(ctx, crd.Name, metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("failed to get CRD %s: %w", crd.Name, err)
			}
			if established(current) {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("timed out waiting for CRD %s to be Established: %w", crd.Name, ctx.Err())
			case <-ticker.C:
			}
		}
	}
	return nil
}

func established(crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
			return true
		}
	}
	return false
}
