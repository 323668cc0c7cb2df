package runnerpolicy

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Label and annotation keys spec.runner may not set on a runner pod,
// whatever a config says. A key's prefix is the DNS domain before its
// '/'; a domain listed here covers its subdomains.
var (
	// terraceDomain: Terrace's own keys decide which pods are runners, of
	// which Stack and run, warm or retained.
	terraceDomain = "terrace.dev"

	// kubernetesDomains are read by Kubernetes' own components. Among
	// them: AppArmor and seccomp profiles (container.apparmor.security.
	// beta.kubernetes.io/*: unconfined), scheduling, and app.kubernetes.io/*,
	// which selects Terrace's own pods and Services (a runner pod labelled
	// app.kubernetes.io/name: terrace-api would receive the Installations
	// API's callers and their tokens).
	kubernetesDomains = []string{"kubernetes.io", "k8s.io"}

	// annotationsAllowed are keys of kubernetesDomains that only ask for
	// something harmless.
	annotationsAllowed = []string{
		"cluster-autoscaler.kubernetes.io/safe-to-evict",
		"kubectl.kubernetes.io/default-container",
	}

	// otherDomains are read by software common enough on nodes and in
	// meshes that a pod could leave its confinement through them: Multus
	// (another network), Istio and Linkerd (out of the mesh's policy).
	otherDomains = []string{"cni.cncf.io", "multus-cni.io", "istio.io", "linkerd.io"}

	// runtimeAnnotationPrefixes are keys without a domain that container
	// runtimes read to change a container (devices, user namespaces,
	// hypervisor and sandbox settings).
	runtimeAnnotationPrefixes = []string{"io.kubernetes.", "io.containerd.", "io.katacontainers.", "dev.gvisor."}
)

// checkMetadata refuses spec.runner labels and annotations whose keys are
// Terrace's, Kubernetes' or a runtime's (sorted, so messages are stable).
func checkMetadata(labels, annotations map[string]string, add addFunc) {
	for _, key := range sortedKeys(labels) {
		if why := reservedKey(key, false); why != "" {
			add(fmt.Sprintf("spec.runner.labels[%s]", key), "the label may not be set: %s", why)
		}
	}
	for _, key := range sortedKeys(annotations) {
		if why := reservedKey(key, true); why != "" {
			add(fmt.Sprintf("spec.runner.annotations[%s]", key), "the annotation may not be set: %s", why)
		}
	}
}

// reservedKey says why key may not be set on a runner pod, "" if it may.
func reservedKey(key string, annotation bool) string {
	domain, _, hasDomain := strings.Cut(key, "/")
	if !hasDomain {
		if annotation && slices.ContainsFunc(runtimeAnnotationPrefixes, func(p string) bool { return strings.HasPrefix(key, p) }) {
			return "container runtimes read it to change the runner's container"
		}
		return ""
	}
	domain = strings.ToLower(domain)
	switch {
	case within(domain, terraceDomain):
		return "terrace.dev keys are Terrace's own: they say which pods are runners, of which Stack and run"
	case annotation && slices.Contains(annotationsAllowed, key):
		return ""
	case slices.ContainsFunc(kubernetesDomains, func(d string) bool { return within(domain, d) }):
		return domain + " keys are read by Kubernetes itself: some change the pod's confinement (AppArmor, seccomp) or which Services and controllers select it"
	case slices.ContainsFunc(otherDomains, func(d string) bool { return within(domain, d) }):
		return domain + " keys move a pod onto another network or out of a service mesh's policy"
	}
	return ""
}

// within says whether domain is d or one of its subdomains.
func within(domain, d string) bool {
	return domain == d || strings.HasSuffix(domain, "."+d)
}

func sortedKeys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }
