package devnode

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

const defaultFileMode = 0o644

// validateVolumes refuses volume types devnode cannot materialise.
func validateVolumes(pod *corev1.Pod) error {
	for _, v := range pod.Spec.Volumes {
		switch {
		case v.Secret != nil, v.ConfigMap != nil, v.EmptyDir != nil, v.DownwardAPI != nil:
		case v.Projected != nil:
			for _, s := range v.Projected.Sources {
				if s.Secret == nil && s.ConfigMap == nil && s.DownwardAPI == nil && s.ServiceAccountToken == nil {
					return &unsupportedError{reason: ReasonUnsupportedVolume, message: fmt.Sprintf(
						"volume %q: devnode supports projected secret, configMap, downwardAPI and serviceAccountToken sources only", v.Name)}
				}
			}
		default:
			return &unsupportedError{reason: ReasonUnsupportedVolume, message: fmt.Sprintf(
				"volume %q: devnode supports secret, configMap, emptyDir, downwardAPI and projected volumes only", v.Name)}
		}
	}
	return nil
}

// fileContent is one file of a materialised volume.
type fileContent struct {
	data []byte
	mode os.FileMode
}

// volumeWriter materialises a pod's volumes under dir/<volume name> and
// keeps them current: Secrets and ConfigMaps are re-read and tokens renewed
// on each write.
type volumeWriter struct {
	client  kubernetes.Interface
	pod     *corev1.Pod
	podIP   string
	dir     string
	written map[string]map[string]bool // volume → files devnode wrote
	tokens  map[string]issuedToken     // volume/path → token
}

type issuedToken struct {
	token    string
	issuedAt time.Time
	expires  time.Time
}

func newVolumeWriter(client kubernetes.Interface, pod *corev1.Pod, podIP, dir string) *volumeWriter {
	return &volumeWriter{client: client, pod: pod, podIP: podIP, dir: dir, written: map[string]map[string]bool{}, tokens: map[string]issuedToken{}}
}

// volumePath is where the volume's files live on the host.
func (w *volumeWriter) volumePath(name string) string { return filepath.Join(w.dir, name) }

// writeAll materialises every volume. A missing Secret or ConfigMap is a
// configError: the caller retries.
func (w *volumeWriter) writeAll(ctx context.Context) error {
	src := newObjectSource(w.client, w.pod.Namespace)
	src.prefetch(ctx, w.pod.Spec.Volumes)
	for _, v := range w.pod.Spec.Volumes {
		path := w.volumePath(v.Name)
		if err := os.MkdirAll(path, 0o755); err != nil {
			return fmt.Errorf("failed to create volume %s: %w", v.Name, err)
		}
		if v.EmptyDir != nil {
			continue
		}
		files, err := w.volumeFiles(ctx, src, v)
		if err != nil {
			return fmt.Errorf("volume %q: %w", v.Name, err)
		}
		if err := w.sync(v.Name, files); err != nil {
			return err
		}
	}
	return nil
}

func (w *volumeWriter) volumeFiles(ctx context.Context, src *objectSource, v corev1.Volume) (map[string]fileContent, error) {
	files := map[string]fileContent{}
	switch {
	case v.Secret != nil:
		return files, w.addSecret(ctx, src, files, v.Secret.SecretName, v.Secret.Items, v.Secret.Optional, v.Secret.DefaultMode)
	case v.ConfigMap != nil:
		return files, w.addConfigMap(ctx, src, files, v.ConfigMap.Name, v.ConfigMap.Items, v.ConfigMap.Optional, v.ConfigMap.DefaultMode)
	case v.DownwardAPI != nil:
		return files, w.addDownwardAPI(files, v.DownwardAPI.Items, v.DownwardAPI.DefaultMode)
	case v.Projected != nil:
		for _, s := range v.Projected.Sources {
			var err error
			switch {
			case s.Secret != nil:
				err = w.addSecret(ctx, src, files, s.Secret.Name, s.Secret.Items, s.Secret.Optional, v.Projected.DefaultMode)
			case s.ConfigMap != nil:
				err = w.addConfigMap(ctx, src, files, s.ConfigMap.Name, s.ConfigMap.Items, s.ConfigMap.Optional, v.Projected.DefaultMode)
			case s.DownwardAPI != nil:
				err = w.addDownwardAPI(files, s.DownwardAPI.Items, v.Projected.DefaultMode)
			case s.ServiceAccountToken != nil:
				err = w.addToken(ctx, files, v.Name, s.ServiceAccountToken, v.Projected.DefaultMode)
			}
			if err != nil {
				return nil, err
			}
		}
	}
	return files, nil
}

func fileMode(itemMode, defaultMode *int32) os.FileMode {
	if itemMode != nil {
		return os.FileMode(*itemMode)
	}
	if defaultMode != nil {
		return os.FileMode(*defaultMode)
	}
	return defaultFileMode
}

func addItems(files map[string]fileContent, data map[string][]byte, items []corev1.KeyToPath, defaultMode *int32, what string) error {
	if len(items) == 0 {
		for k, v := range data {
			files[k] = fileContent{data: v, mode: fileMode(nil, defaultMode)}
		}
		return nil
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			return &configError{fmt.Sprintf("key %q not found in %s", it.Key, what)}
		}
		files[it.Path] = fileContent{data: v, mode: fileMode(it.Mode, defaultMode)}
	}
	return nil
}

func (w *volumeWriter) addSecret(ctx context.Context, src *objectSource, files map[string]fileContent, name string, items []corev1.KeyToPath, optional *bool, defaultMode *int32) error {
	sec, err := src.secret(ctx, name, optional)
	if err != nil || sec == nil {
		return err
	}
	return addItems(files, sec.Data, items, defaultMode, fmt.Sprintf("secret %q", name))
}

func (w *volumeWriter) addConfigMap(ctx context.Context, src *objectSource, files map[string]fileContent, name string, items []corev1.KeyToPath, optional *bool, defaultMode *int32) error {
	cm, err := src.configMap(ctx, name, optional)
	if err != nil || cm == nil {
		return err
	}
	data := make(map[string][]byte, len(cm.Data)+len(cm.BinaryData))
	for k, v := range cm.Data {
		data[k] = []byte(v)
	}
	for k, v := range cm.BinaryData {
		data[k] = v
	}
	return addItems(files, data, items, defaultMode, fmt.Sprintf("configmap %q", name))
}

func (w *volumeWriter) addDownwardAPI(files map[string]fileContent, items []corev1.DownwardAPIVolumeFile, defaultMode *int32) error {
	for _, it := range items {
		var value string
		var err error
		switch {
		case it.FieldRef != nil:
			value, err = fieldValue(w.pod, it.FieldRef.FieldPath, w.podIP)
		case it.ResourceFieldRef != nil:
			c := containerNamed(w.pod, it.ResourceFieldRef.ContainerName)
			if c == nil {
				return &configError{fmt.Sprintf("downward API item %q: no container %q", it.Path, it.ResourceFieldRef.ContainerName)}
			}
			value, err = resourceValue(c, it.ResourceFieldRef)
		}
		if err != nil {
			return err
		}
		files[it.Path] = fileContent{data: []byte(value), mode: fileMode(it.Mode, defaultMode)}
	}
	return nil
}

// addToken requests a bound service-account token from the API server, as
// the kubelet does, and reuses it until 80% of its lifetime has passed.
func (w *volumeWriter) addToken(ctx context.Context, files map[string]fileContent, volume string, p *corev1.ServiceAccountTokenProjection, defaultMode *int32) error {
	key := volume + "/" + p.Path
	tok, ok := w.tokens[key]
	if !ok || time.Now().After(tok.issuedAt.Add(tok.expires.Sub(tok.issuedAt)*8/10)) {
		expiration := int64(3600)
		if p.ExpirationSeconds != nil {
			expiration = *p.ExpirationSeconds
		}
		req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: &expiration,
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: w.pod.Name, UID: w.pod.UID},
		}}
		if p.Audience != "" {
			req.Spec.Audiences = []string{p.Audience}
		}
		resp, err := w.client.CoreV1().ServiceAccounts(w.pod.Namespace).CreateToken(ctx, serviceAccountName(w.pod), req, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("failed to request a token for service account %q: %w", serviceAccountName(w.pod), err)
		}
		tok = issuedToken{token: resp.Status.Token, issuedAt: time.Now(), expires: resp.Status.ExpirationTimestamp.Time}
		w.tokens[key] = tok
	}
	mode := fileMode(nil, defaultMode)
	if defaultMode == nil {
		mode = 0o600
	}
	files[p.Path] = fileContent{data: []byte(tok.token), mode: mode}
	return nil
}

// sync makes the volume directory hold exactly files, replacing changed
// files atomically (write and rename) so a reader never sees half a file.
func (w *volumeWriter) sync(volume string, files map[string]fileContent) error {
	root := w.volumePath(volume)
	before := w.written[volume]
	now := map[string]bool{}
	for rel, f := range files {
		clean := filepath.Clean(rel)
		if filepath.IsAbs(clean) || clean == ".." || strings.HasPrefix(clean, "../") {
			return &unsupportedError{reason: ReasonUnsupportedVolume, message: fmt.Sprintf("volume %q: item path %q leaves the volume", volume, rel)}
		}
		now[clean] = true
		path := filepath.Join(root, clean)
		if current, err := os.ReadFile(path); err == nil && bytes.Equal(current, f.data) {
			if info, err := os.Stat(path); err == nil && info.Mode().Perm() == f.mode.Perm() {
				continue
			}
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return fmt.Errorf("failed to create directory for %s: %w", rel, err)
		}
		tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-")
		if err != nil {
			return fmt.Errorf("failed to write volume %s: %w", volume, err)
		}
		_, werr := tmp.Write(f.data)
		cerr := tmp.Close()
		if werr != nil || cerr != nil {
			_ = os.Remove(tmp.Name())
			return fmt.Errorf("failed to write volume %s file %s", volume, rel)
		}
		if err := os.Chmod(tmp.Name(), f.mode.Perm()); err != nil {
			_ = os.Remove(tmp.Name())
			return fmt.Errorf("failed to set mode of %s: %w", rel, err)
		}
		if err := os.Rename(tmp.Name(), path); err != nil {
			_ = os.Remove(tmp.Name())
			return fmt.Errorf("failed to replace %s: %w", rel, err)
		}
	}
	for rel := range before {
		if !now[rel] {
			_ = os.Remove(filepath.Join(root, rel))
		}
	}
	w.written[volume] = now
	return nil
}

func containerNamed(pod *corev1.Pod, name string) *corev1.Container {
	for i := range pod.Spec.Containers {
		if name == "" || pod.Spec.Containers[i].Name == name {
			return &pod.Spec.Containers[i]
		}
	}
	return nil
}

// containerRoot lays out a container's view of the filesystem: every
// volumeMount appears at root+mountPath as a symbolic link to the volume
// (or its subPath) on the host.
func containerRoot(root string, mounts []corev1.VolumeMount, volumeDir string, lookup func(string) (string, bool)) error {
	for _, m := range mounts {
		target := filepath.Join(volumeDir, m.Name)
		sub := m.SubPath
		if m.SubPathExpr != "" {
			sub = expand(m.SubPathExpr, lookup)
		}
		if sub != "" {
			clean := filepath.Clean(sub)
			if filepath.IsAbs(clean) || clean == ".." || strings.HasPrefix(clean, "../") {
				return &unsupportedError{reason: ReasonUnsupportedVolume, message: fmt.Sprintf("volumeMount %q: subPath %q leaves the volume", m.Name, sub)}
			}
			target = filepath.Join(target, clean)
			if _, err := os.Stat(target); os.IsNotExist(err) {
				if err := os.MkdirAll(target, 0o755); err != nil {
					return fmt.Errorf("failed to create subPath %s: %w", sub, err)
				}
			}
		}
		link := filepath.Join(root, filepath.Clean("/"+m.MountPath))
		if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
			return fmt.Errorf("failed to create mount point %s: %w", m.MountPath, err)
		}
		_ = os.Remove(link)
		if err := os.Symlink(target, link); err != nil {
			return fmt.Errorf("failed to mount %s at %s: %w", m.Name, m.MountPath, err)
		}
	}
	return nil
}

// pathMapper rewrites a container's mount paths into its root on the host.
type pathMapper struct {
	root   string
	mounts []string // clean mount paths, longest first
}

func newPathMapper(root string, mounts []corev1.VolumeMount) pathMapper {
	m := pathMapper{root: root}
	for _, vm := range mounts {
		p := filepath.Clean("/" + vm.MountPath)
		if p != "/" {
			m.mounts = append(m.mounts, p)
		}
	}
	// Longest first, so /etc/tls/ca wins over /etc/tls.
	for i := 1; i < len(m.mounts); i++ {
		for j := i; j > 0 && len(m.mounts[j]) > len(m.mounts[j-1]); j-- {
			m.mounts[j], m.mounts[j-1] = m.mounts[j-1], m.mounts[j]
		}
	}
	return m
}

// isSeparator ends or starts a path inside a value: "--flag=/x", "a:/x", "/x,/y".
func isSeparator(b byte) bool { return b == '=' || b == ':' || b == ',' }

// rewrite replaces every mount path in s that starts the value or follows
// '=', ':' or ',' and ends at the value's end, '/', or one of those
// separators, with the same path under the container root. Other text,
// including other absolute paths, is left alone.
func (m pathMapper) rewrite(s string) string {
	if len(m.mounts) == 0 || !strings.Contains(s, "/") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '/' && (i == 0 || isSeparator(s[i-1])) {
			if p := m.match(s[i:]); p != "" {
				b.WriteString(m.root)
				b.WriteString(p)
				i += len(p) - 1
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func (m pathMapper) match(s string) string {
	for _, p := range m.mounts {
		if strings.HasPrefix(s, p) && (len(s) == len(p) || s[len(p)] == '/' || isSeparator(s[len(p)])) {
			return p
		}
	}
	return ""
}
