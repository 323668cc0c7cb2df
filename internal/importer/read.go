package importer

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// maxDocumentBytes bounds one YAML document read from a file.
const maxDocumentBytes = 4 << 20

// ReadObjects reads Terraform objects from YAML or JSON (several documents,
// or a List). Documents of other kinds are an error naming them: a file
// of mixed objects should be filtered first.
func ReadObjects(r io.Reader) ([]*unstructured.Unstructured, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReaderSize(r, 64<<10))
	var out []*unstructured.Unstructured
	for i := 0; ; i++ {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}
		if len(doc) > maxDocumentBytes {
			return nil, fmt.Errorf("document %d is larger than %d bytes", i+1, maxDocumentBytes)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj := &unstructured.Unstructured{}
		if err := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(doc), len(doc)).Decode(&obj.Object); err != nil {
			return nil, fmt.Errorf("document %d is not a Kubernetes object: %w", i+1, err)
		}
		if len(obj.Object) == 0 {
			continue
		}
		if obj.IsList() {
			list, err := obj.ToList()
			if err != nil {
				return nil, fmt.Errorf("document %d: %w", i+1, err)
			}
			for j := range list.Items {
				out = append(out, &list.Items[j])
			}
			continue
		}
		out = append(out, obj)
	}
}

// ListObjects lists the Terraform objects of a namespace ("" for all) from a cluster.
func ListObjects(ctx context.Context, c client.Reader, namespace string) ([]*unstructured.Unstructured, error) {
	list := &unstructured.UnstructuredList{}
	list.SetAPIVersion(TerraformAPIVersion)
	list.SetKind(TerraformKind + "List")
	if err := c.List(ctx, list, client.InNamespace(namespace)); err != nil {
		return nil, fmt.Errorf("failed to list %s objects (is tofu-controller's CRD installed?): %w", TerraformKind, err)
	}
	out := make([]*unstructured.Unstructured, len(list.Items))
	for i := range list.Items {
		out[i] = &list.Items[i]
	}
	return out, nil
}
