package runnerpolicy

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// MaxReferences bounds the objects one spec.runner may name: each is a
// SubjectAccessReview before every run.
const MaxReferences = 64

// Access is what the runner's ServiceAccount must be allowed to do for the
// kubelet to put an object into the runner pod on its behalf: the
// attributes of a SubjectAccessReview in the Stack's namespace.
type Access struct {
	// Verb: "get", or "create" for a token.
	Verb string
	// Group is the API group ("" for the core group).
	Group string
	// Resource is the plural resource: secrets, configmaps, ...
	Resource string
	// Subresource: "token" for a ServiceAccount token, else "".
	Subresource string
	// Name of the object.
	Name string
}

// Kind names the object for messages: "Secret", "ConfigMap", ...
func (a Access) Kind() string {
	switch {
	case a.Resource == "secrets":
		return "Secret"
	case a.Resource == "configmaps":
		return "ConfigMap"
	case a.Resource == "persistentvolumeclaims":
		return "PersistentVolumeClaim"
	case a.Resource == "volumesnapshots":
		return "VolumeSnapshot"
	case a.Resource == "serviceaccounts" && a.Subresource == "token":
		return "a token of ServiceAccount"
	}
	return a.Resource
}

// ResourceName is the resource as RBAC and kubectl write it: secrets,
// serviceaccounts/token, volumesnapshots.snapshot.storage.k8s.io.
func (a Access) ResourceName() string {
	r := a.Resource
	if a.Group != "" {
		r += "." + a.Group
	}
	if a.Subresource != "" {
		r += "/" + a.Subresource
	}
	return r
}

// Reference is one object spec.runner names, the fields that name it (an
// object named twice is one review), and the access it needs.
type Reference struct {
	Access Access
	Fields []string
}

// References lists every object of the Stack's namespace that a pod made
// from t would hand to module code, through the kubelet, whatever the
// pod's ServiceAccount may read: Secrets and ConfigMaps in volumes
// (projected ones included), env and envFrom; claims and snapshots
// mounted or cloned; the Secrets volume drivers are given; and a token of
// the pod's own ServiceAccount for an audience of the Stack's choosing,
// which is the right to create serviceaccounts/token for it. The
// controller asks, for each, whether the ServiceAccount may do as much
// itself (internal/controller/stack). Optional references are listed too:
// a Stack learns nothing from whether an object exists.
//
// serviceAccount is the account the pod runs as. The order is stable
// (the first field that names each object).
func References(t *terracev1.RunnerPodTemplate, serviceAccount string) []Reference {
	if t == nil {
		return nil
	}
	var out []Reference
	add := func(field string, a Access) {
		if a.Name == "" {
			return // refused by the API server, or names nothing
		}
		for i := range out {
			if out[i].Access == a {
				out[i].Fields = append(out[i].Fields, field)
				return
			}
		}
		out = append(out, Reference{Access: a, Fields: []string{field}})
	}
	for i := range t.Volumes {
		volumeReferences(fmt.Sprintf("spec.runner.volumes[%d]", i), &t.Volumes[i].VolumeSource, serviceAccount, add)
	}
	for i, e := range t.Env {
		if e.ValueFrom == nil {
			continue
		}
		field := fmt.Sprintf("spec.runner.env[%d].valueFrom", i)
		if r := e.ValueFrom.SecretKeyRef; r != nil {
			add(field+".secretKeyRef", get("secrets", r.Name))
		}
		if r := e.ValueFrom.ConfigMapKeyRef; r != nil {
			add(field+".configMapKeyRef", get("configmaps", r.Name))
		}
	}
	for i, e := range t.EnvFrom {
		field := fmt.Sprintf("spec.runner.envFrom[%d]", i)
		if r := e.SecretRef; r != nil {
			add(field+".secretRef", get("secrets", r.Name))
		}
		if r := e.ConfigMapRef; r != nil {
			add(field+".configMapRef", get("configmaps", r.Name))
		}
	}
	return out
}

func get(resource, name string) Access { return Access{Verb: "get", Resource: resource, Name: name} }

// volumeReferences lists what one volume names. Every source that takes
// a Secret is here, the in-tree drivers' too: a config may allow them.
func volumeReferences(field string, v *corev1.VolumeSource, serviceAccount string, add func(string, Access)) {
	local := func(sub string, r *corev1.LocalObjectReference) {
		if r != nil {
			add(field+sub, get("secrets", r.Name))
		}
	}
	switch {
	case v.Secret != nil:
		add(field+".secret.secretName", get("secrets", v.Secret.SecretName))
	case v.ConfigMap != nil:
		add(field+".configMap.name", get("configmaps", v.ConfigMap.Name))
	case v.PersistentVolumeClaim != nil:
		add(field+".persistentVolumeClaim.claimName", get("persistentvolumeclaims", v.PersistentVolumeClaim.ClaimName))
	case v.Projected != nil:
		for j, src := range v.Projected.Sources {
			f := fmt.Sprintf("%s.projected.sources[%d]", field, j)
			switch {
			case src.Secret != nil:
				add(f+".secret.name", get("secrets", src.Secret.Name))
			case src.ConfigMap != nil:
				add(f+".configMap.name", get("configmaps", src.ConfigMap.Name))
			case src.ServiceAccountToken != nil && src.ServiceAccountToken.Audience != "":
				// No audience is the API server's: the token the pod
				// mounts anyway. Any other is a credential for another
				// system that trusts this cluster's issuer.
				add(f+".serviceAccountToken", Access{Verb: "create", Resource: "serviceaccounts", Subresource: "token", Name: serviceAccount})
			}
		}
	case v.Ephemeral != nil:
		for _, ds := range dataSources(field, v) {
			if a, ok := ds.access(); ok {
				add(ds.field, a)
			}
		}
	case v.CSI != nil:
		local(".csi.nodePublishSecretRef", v.CSI.NodePublishSecretRef)
	case v.AzureFile != nil:
		add(field+".azureFile.secretName", get("secrets", v.AzureFile.SecretName))
	case v.CephFS != nil:
		local(".cephfs.secretRef", v.CephFS.SecretRef)
	case v.Cinder != nil:
		local(".cinder.secretRef", v.Cinder.SecretRef)
	case v.FlexVolume != nil:
		local(".flexVolume.secretRef", v.FlexVolume.SecretRef)
	case v.ISCSI != nil:
		local(".iscsi.secretRef", v.ISCSI.SecretRef)
	case v.RBD != nil:
		local(".rbd.secretRef", v.RBD.SecretRef)
	case v.ScaleIO != nil:
		local(".scaleIO.secretRef", v.ScaleIO.SecretRef)
	case v.StorageOS != nil:
		local(".storageos.secretRef", v.StorageOS.SecretRef)
	}
}

// dataSource is an object an ephemeral volume's claim is cloned from.
type dataSource struct {
	field      string
	group      *string
	kind, name string
	namespace  *string
}

// dataSources lists what the claim of an ephemeral volume is cloned from.
func dataSources(field string, v *corev1.VolumeSource) []dataSource {
	if v.Ephemeral == nil || v.Ephemeral.VolumeClaimTemplate == nil {
		return nil
	}
	spec := &v.Ephemeral.VolumeClaimTemplate.Spec
	field += ".ephemeral.volumeClaimTemplate.spec"
	var out []dataSource
	if ds := spec.DataSource; ds != nil {
		out = append(out, dataSource{field: field + ".dataSource", group: ds.APIGroup, kind: ds.Kind, name: ds.Name})
	}
	if ds := spec.DataSourceRef; ds != nil {
		out = append(out, dataSource{field: field + ".dataSourceRef", group: ds.APIGroup, kind: ds.Kind, name: ds.Name, namespace: ds.Namespace})
	}
	return out
}

// access is what cloning the source needs: claims and snapshots, which
// RBAC can name. checkReferences refuses the rest.
func (ds dataSource) access() (Access, bool) {
	g := ""
	if ds.group != nil {
		g = *ds.group
	}
	switch {
	case g == "" && ds.kind == "PersistentVolumeClaim":
		return get("persistentvolumeclaims", ds.name), true
	case g == snapshotGroup && ds.kind == "VolumeSnapshot":
		return Access{Verb: "get", Group: snapshotGroup, Resource: "volumesnapshots", Name: ds.name}, true
	}
	return Access{}, false
}

const snapshotGroup = "snapshot.storage.k8s.io"

// checkReferences refuses what References cannot put to the runner's
// rights: too many objects, a data source of another kind or namespace.
func (p Policy) checkReferences(pod Pod, add addFunc) {
	t := pod.Template
	if n := len(References(t, pod.ServiceAccountName)); n > MaxReferences {
		add("spec.runner", "names %d Secrets, ConfigMaps, claims and tokens; at most %d are allowed", n, MaxReferences)
	}
	for i := range t.Volumes {
		for _, ds := range dataSources(fmt.Sprintf("spec.runner.volumes[%d]", i), &t.Volumes[i].VolumeSource) {
			_, ok := ds.access()
			switch {
			case ds.namespace != nil && *ds.namespace != "":
				add(ds.field+".namespace", "a data source in another namespace is never allowed")
			case !ok:
				add(ds.field, "a data source of kind %s cannot be checked against the runner's ServiceAccount: name a PersistentVolumeClaim or a VolumeSnapshot", ds.kind)
			}
		}
	}
}

// secretVolumeFields lists the volumes that put a Secret, or a token for
// another audience than the API server's, into the pod's files: what
// allowEnv: false refuses besides env and envFrom.
func secretVolumeFields(t *terracev1.RunnerPodTemplate) []string {
	var out []string
	for i, v := range t.Volumes {
		field := fmt.Sprintf("spec.runner.volumes[%d]", i)
		if v.Secret != nil {
			out = append(out, field+".secret")
		}
		if v.Projected == nil {
			continue
		}
		for j, src := range v.Projected.Sources {
			f := fmt.Sprintf("%s.projected.sources[%d]", field, j)
			switch {
			case src.Secret != nil:
				out = append(out, f+".secret")
			case src.ServiceAccountToken != nil && src.ServiceAccountToken.Audience != "":
				out = append(out, f+".serviceAccountToken")
			}
		}
	}
	return out
}
