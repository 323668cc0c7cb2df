// Package scheme builds the runtime.Scheme every Terrace client uses: the
// built-in Kubernetes kinds plus Terrace's.
package scheme

import (
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// New returns a scheme with the built-in kinds and Terrace's.
func New() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := terracev1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}
