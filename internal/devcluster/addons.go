package devcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// coreDNSManifests is the cluster DNS as kubeadm installs it, reduced to
// what a one-node dev cluster needs: a Deployment of CoreDNS behind the
// kube-dns Service. It answers for cluster.local only: with no forward
// plugin, any other name fails, as nothing beyond the cluster is reachable.
// It listens on 1053 so it needs no capability; the Service maps 53 to it.
const coreDNSManifests = `
apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects:
- {kind: ServiceAccount, name: coredns, namespace: kube-system}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    .:1053 {
        errors
        health :8080
        ready :8181
        kubernetes cluster.local in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
            ttl 30
        }
        cache 30
        loop
    }
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: coredns
  namespace: kube-system
  labels: {k8s-app: kube-dns}
spec:
  replicas: 1
  selector:
    matchLabels: {k8s-app: kube-dns}
  template:
    metadata:
      labels: {k8s-app: kube-dns}
    spec:
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      dnsPolicy: Default
      securityContext:
        runAsNonRoot: true
        runAsUser: 65532
        runAsGroup: 65532
        seccompProfile: {type: RuntimeDefault}
      containers:
      - name: coredns
        image: {{IMAGE}}
        args: [-conf, /etc/coredns/Corefile]
        ports:
        - {name: dns, containerPort: 1053, protocol: UDP}
        - {name: dns-tcp, containerPort: 1053, protocol: TCP}
        resources:
          requests: {cpu: 50m, memory: 40Mi}
          limits: {memory: 128Mi}
        readinessProbe:
          httpGet: {path: /ready, port: 8181}
          periodSeconds: 2
        livenessProbe:
          httpGet: {path: /health, port: 8080}
          initialDelaySeconds: 10
        securityContext:
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
          capabilities: {drop: [ALL]}
        volumeMounts:
        - {name: config, mountPath: /etc/coredns, readOnly: true}
      volumes:
      - name: config
        configMap: {name: coredns}
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {k8s-app: kube-dns}
spec:
  clusterIP: {{DNS_IP}}
  selector: {k8s-app: kube-dns}
  ports:
  - {name: dns, port: 53, targetPort: 1053, protocol: UDP}
  - {name: dns-tcp, port: 53, targetPort: 1053, protocol: TCP}
`

// installCoreDNS applies the cluster DNS and waits until it serves.
func installCoreDNS(ctx context.Context, cfg *rest.Config, dnsIP string, progress func(string)) error {
	manifests := strings.NewReplacer("{{IMAGE}}", CoreDNSImage, "{{DNS_IP}}", dnsIP).Replace(coreDNSManifests)
	return applyAndWait(ctx, cfg, "coredns", []byte(manifests), progress)
}

// RenderKustomization builds a kustomization directory (such as
// config/default) as `kubectl apply -k` would.
func RenderKustomization(dir string) ([]byte, error) {
	resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("failed to build the kustomization %s: %w", dir, err)
	}
	out, err := resources.AsYaml()
	if err != nil {
		return nil, fmt.Errorf("failed to render the kustomization %s: %w", dir, err)
	}
	return out, nil
}

// applyAndWait server-side applies every object of a YAML stream and waits
// until each is Current (a Deployment Available at its generation).
func applyAndWait(ctx context.Context, cfg *rest.Config, source string, manifests []byte, progress func(string)) error {
	objs, err := decodeStream(source, manifests)
	if err != nil {
		return err
	}
	if err := Apply(ctx, cfg, objs, progress); err != nil {
		return err
	}
	outcomes, err := WaitAll(ctx, cfg, objs, progress)
	if err != nil {
		return err
	}
	for _, o := range outcomes {
		if o.Health != Current {
			return fmt.Errorf("%s is %s: %s", o.Ref(), o.Health, o.Message)
		}
	}
	return nil
}

func decodeStream(source string, data []byte) ([]Applied, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []Applied
	for {
		var raw map[string]any
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("failed to decode %s: %w", source, err)
		}
		if len(raw) > 0 {
			out = append(out, Applied{Object: &unstructured.Unstructured{Object: raw}, Source: source})
		}
	}
}
