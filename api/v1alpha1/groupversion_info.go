// Package v1alpha1 holds the Terrace API: Program, Stack and TerraceConfig in
// the terrace.dev group.
//
// +kubebuilder:object:generate=true
// +groupName=terrace.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of every Terrace kind.
	GroupVersion = schema.GroupVersion{Group: "terrace.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the Terrace kinds with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the Terrace kinds to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
