package devnode

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// configError is a container configuration that cannot be resolved yet (a
// missing Secret or key). The pod stays Pending and devnode retries, as the
// kubelet does with CreateContainerConfigError.
type configError struct{ msg string }

func (e *configError) Error() string { return e.msg }

// objectSource reads the Secrets and ConfigMaps of one namespace, each at
// most once per resolution.
type objectSource struct {
	client    kubernetes.Interface
	namespace string

	mu         sync.Mutex
	secrets    map[string]*corev1.Secret
	configMaps map[string]*corev1.ConfigMap
}

func newObjectSource(client kubernetes.Interface, namespace string) *objectSource {
	return &objectSource{client: client, namespace: namespace, secrets: map[string]*corev1.Secret{}, configMaps: map[string]*corev1.ConfigMap{}}
}

// secret returns the Secret, nil when it is missing and optional.
func (s *objectSource) secret(ctx context.Context, name string, optional *bool) (*corev1.Secret, error) {
	return lookup(s, s.secrets, "secret", name, optional, func() (*corev1.Secret, error) {
		return s.client.CoreV1().Secrets(s.namespace).Get(ctx, name, metav1.GetOptions{})
	})
}

// configMap returns the ConfigMap, nil when it is missing and optional.
func (s *objectSource) configMap(ctx context.Context, name string, optional *bool) (*corev1.ConfigMap, error) {
	return lookup(s, s.configMaps, "configmap", name, optional, func() (*corev1.ConfigMap, error) {
		return s.client.CoreV1().ConfigMaps(s.namespace).Get(ctx, name, metav1.GetOptions{})
	})
}

// lookup reads an object at most once per resolution: a miss is remembered
// too, so a prefetch's miss costs no second GET.
func lookup[T any](s *objectSource, cache map[string]*T, kind, name string, optional *bool, get func() (*T, error)) (*T, error) {
	s.mu.Lock()
	obj, ok := cache[name]
	s.mu.Unlock()
	if !ok {
		var err error
		if obj, err = get(); apierrors.IsNotFound(err) {
			obj = nil
		} else if err != nil {
			return nil, fmt.Errorf("failed to get %s %q: %w", kind, name, err)
		}
		s.mu.Lock()
		cache[name] = obj
		s.mu.Unlock()
	}
	if obj == nil {
		if optional != nil && *optional {
			return nil, nil
		}
		return nil, &configError{fmt.Sprintf("%s %q not found", kind, name)}
	}
	return obj, nil
}

// prefetch reads the Secrets and ConfigMaps the pod's volumes name, all at
// once, so materialising the volumes waits for one round trip rather than
// one per object. Failures are left for the volume that needs the object
// to report.
func (s *objectSource) prefetch(ctx context.Context, volumes []corev1.Volume) {
	var wg sync.WaitGroup
	get := func(f func()) {
		wg.Add(1)
		go func() { defer wg.Done(); f() }()
	}
	seen := map[string]bool{}
	for _, v := range volumes {
		var secrets, configMaps []string
		switch {
		case v.Secret != nil:
			secrets = append(secrets, v.Secret.SecretName)
		case v.ConfigMap != nil:
			configMaps = append(configMaps, v.ConfigMap.Name)
		case v.Projected != nil:
			for _, src := range v.Projected.Sources {
				if src.Secret != nil {
					secrets = append(secrets, src.Secret.Name)
				}
				if src.ConfigMap != nil {
					configMaps = append(configMaps, src.ConfigMap.Name)
				}
			}
		}
		for _, name := range secrets {
			if !seen["s/"+name] {
				seen["s/"+name] = true
				get(func() { _, _ = s.secret(ctx, name, nil) })
			}
		}
		for _, name := range configMaps {
			if !seen["c/"+name] {
				seen["c/"+name] = true
				get(func() { _, _ = s.configMap(ctx, name, nil) })
			}
		}
	}
	wg.Wait()
}

func configMapValue(cm *corev1.ConfigMap, key string) (string, bool) {
	if v, ok := cm.Data[key]; ok {
		return v, true
	}
	if v, ok := cm.BinaryData[key]; ok {
		return string(v), true
	}
	return "", false
}

// envVar is one resolved variable.
type envVar struct{ name, value string }

// resolveEnv computes a container's variables in the kubelet's order:
// envFrom sources, then env entries, each able to refer to earlier ones with
// $(NAME). base holds what devnode injects; the pod's own entries win.
func resolveEnv(ctx context.Context, src *objectSource, pod *corev1.Pod, c *corev1.Container, podIP string, base []envVar) ([]envVar, error) {
	vars := newEnvList(base)
	for _, from := range c.EnvFrom {
		switch {
		case from.SecretRef != nil:
			sec, err := src.secret(ctx, from.SecretRef.Name, from.SecretRef.Optional)
			if err != nil {
				return nil, err
			}
			if sec == nil {
				continue
			}
			for _, k := range sortedKeys(sec.Data) {
				vars.set(from.Prefix+k, string(sec.Data[k]))
			}
		case from.ConfigMapRef != nil:
			cm, err := src.configMap(ctx, from.ConfigMapRef.Name, from.ConfigMapRef.Optional)
			if err != nil {
				return nil, err
			}
			if cm == nil {
				continue
			}
			for _, k := range sortedKeys(cm.Data) {
				vars.set(from.Prefix+k, cm.Data[k])
			}
		}
	}
	for _, e := range c.Env {
		value, ok, err := envValue(ctx, src, pod, c, podIP, e, vars.lookup)
		if err != nil {
			return nil, err
		}
		if ok {
			vars.set(e.Name, value)
		}
	}
	return vars.list, nil
}

func envValue(ctx context.Context, src *objectSource, pod *corev1.Pod, c *corev1.Container, podIP string, e corev1.EnvVar, lookup func(string) (string, bool)) (string, bool, error) {
	if e.ValueFrom == nil {
		return expand(e.Value, lookup), true, nil
	}
	vf := e.ValueFrom
	switch {
	case vf.SecretKeyRef != nil:
		sec, err := src.secret(ctx, vf.SecretKeyRef.Name, vf.SecretKeyRef.Optional)
		if err != nil || sec == nil {
			return "", false, err
		}
		v, ok := sec.Data[vf.SecretKeyRef.Key]
		if !ok {
			if vf.SecretKeyRef.Optional != nil && *vf.SecretKeyRef.Optional {
				return "", false, nil
			}
			return "", false, &configError{fmt.Sprintf("couldn't find key %s in Secret %s/%s", vf.SecretKeyRef.Key, pod.Namespace, vf.SecretKeyRef.Name)}
		}
		return string(v), true, nil
	case vf.ConfigMapKeyRef != nil:
		cm, err := src.configMap(ctx, vf.ConfigMapKeyRef.Name, vf.ConfigMapKeyRef.Optional)
		if err != nil || cm == nil {
			return "", false, err
		}
		v, ok := configMapValue(cm, vf.ConfigMapKeyRef.Key)
		if !ok {
			if vf.ConfigMapKeyRef.Optional != nil && *vf.ConfigMapKeyRef.Optional {
				return "", false, nil
			}
			return "", false, &configError{fmt.Sprintf("couldn't find key %s in ConfigMap %s/%s", vf.ConfigMapKeyRef.Key, pod.Namespace, vf.ConfigMapKeyRef.Name)}
		}
		return v, true, nil
	case vf.FieldRef != nil:
		v, err := fieldValue(pod, vf.FieldRef.FieldPath, podIP)
		return v, err == nil, err
	case vf.ResourceFieldRef != nil:
		v, err := resourceValue(c, vf.ResourceFieldRef)
		return v, err == nil, err
	}
	return "", false, &unsupportedError{reason: "UnsupportedEnv", message: fmt.Sprintf("env %s: unsupported valueFrom", e.Name)}
}

// fieldValue answers the downward API's field paths.
func fieldValue(pod *corev1.Pod, fieldPath, podIP string) (string, error) {
	switch fieldPath {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "metadata.labels":
		return formatMap(pod.Labels), nil
	case "metadata.annotations":
		return formatMap(pod.Annotations), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return serviceAccountName(pod), nil
	case "status.podIP", "status.podIPs":
		return podIP, nil
	case "status.hostIP", "status.hostIPs":
		return hostIP, nil
	}
	for _, m := range []struct {
		prefix string
		values map[string]string
	}{{"metadata.labels", pod.Labels}, {"metadata.annotations", pod.Annotations}} {
		if rest, ok := strings.CutPrefix(fieldPath, m.prefix+"['"); ok {
			if key, ok := strings.CutSuffix(rest, "']"); ok {
				return m.values[key], nil
			}
		}
	}
	return "", &unsupportedError{reason: "UnsupportedFieldRef", message: fmt.Sprintf("field path %q is not supported", fieldPath)}
}

// Node allocatable as devnode reports it; limits default to it as on a kubelet.
var (
	nodeCPU    = resource.MustParse("2")
	nodeMemory = resource.MustParse("8Gi")
)

func resourceValue(c *corev1.Container, ref *corev1.ResourceFieldSelector) (string, error) {
	var q resource.Quantity
	switch ref.Resource {
	case "limits.cpu", "limits.memory", "limits.ephemeral-storage":
		name := corev1.ResourceName(strings.TrimPrefix(ref.Resource, "limits."))
		if l, ok := c.Resources.Limits[name]; ok {
			q = l
		} else if name == corev1.ResourceCPU {
			q = nodeCPU
		} else {
			q = nodeMemory
		}
	case "requests.cpu", "requests.memory", "requests.ephemeral-storage":
		q = c.Resources.Requests[corev1.ResourceName(strings.TrimPrefix(ref.Resource, "requests."))]
	default:
		return "", &unsupportedError{reason: "UnsupportedFieldRef", message: fmt.Sprintf("resource %q is not supported", ref.Resource)}
	}
	divisor := ref.Divisor
	if divisor.IsZero() {
		divisor = resource.MustParse("1")
	}
	// The kubelet rounds up, so a 500m CPU limit reads as 1.
	v := math.Ceil(float64(q.MilliValue()) / float64(divisor.MilliValue()))
	return strconv.FormatInt(int64(v), 10), nil
}

func serviceAccountName(pod *corev1.Pod) string {
	if pod.Spec.ServiceAccountName != "" {
		return pod.Spec.ServiceAccountName
	}
	return "default"
}

func formatMap(m map[string]string) string {
	var b strings.Builder
	for _, k := range sortedKeys(m) {
		fmt.Fprintf(&b, "%s=%q\n", k, m[k])
	}
	return b.String()
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// envList keeps variables in first-definition order; a later set replaces
// the value in place.
type envList struct {
	list  []envVar
	index map[string]int
}

func newEnvList(base []envVar) *envList {
	l := &envList{index: map[string]int{}}
	for _, v := range base {
		l.set(v.name, v.value)
	}
	return l
}

func (l *envList) set(name, value string) {
	if i, ok := l.index[name]; ok {
		l.list[i].value = value
		return
	}
	l.index[name] = len(l.list)
	l.list = append(l.list, envVar{name, value})
}

func (l *envList) lookup(name string) (string, bool) {
	if i, ok := l.index[name]; ok {
		return l.list[i].value, true
	}
	return "", false
}

// expand replaces $(NAME) with known variables as Kubernetes does: $$
// escapes a dollar, unknown references stay as written.
func expand(s string, lookup func(string) (string, bool)) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := lookup(name); ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}
