{{/* Labels of every object, as config/default sets them, plus Helm's. */}}
{{- define "terrace.labels" -}}
app.kubernetes.io/name: terrace
app.kubernetes.io/component: controller
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* What the Service, PDB and Deployment select: the labels config/default uses. */}}
{{- define "terrace.selector" -}}
app.kubernetes.io/name: terrace
app.kubernetes.io/component: controller
{{- end }}

{{/* The controller image: repository@digest, or repository:tag. */}}
{{- define "terrace.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/*
The generated roles (config/rbac, copied into files/ by make generate), one
object per document, with this chart's labels and the Role in the release
namespace. The Installations API servers need no installed role: the
controller makes a Role in each namespace that runs one.
*/}}
{{- define "terrace.generatedRoles" -}}
{{- range $file := list "files/role.yaml" }}
{{- range $doc := regexSplit "(?m)^---\\s*$" ($.Files.Get $file) -1 }}
{{- $obj := fromYaml $doc }}
{{- if $obj.kind }}
{{- $meta := $obj.metadata }}
{{- $_ := set $meta "labels" (include "terrace.labels" $ | fromYaml) }}
{{- if eq $obj.kind "Role" }}{{ $_ := set $meta "namespace" $.Release.Namespace }}{{ end }}
---
{{ toYaml $obj }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The namespaced mode's namespaces, comma-separated: the release namespace
first, then watchNamespaces in order, each once; empty in the all-namespaces
mode. Fails on what the controller would refuse at its start (a system
namespace) and on watchNamespaces without rbac.namespaced, which would
restrict nothing the values promise.
*/}}
{{- define "terrace.watchedNamespaces" -}}
{{- $system := list "kube-system" "kube-public" "kube-node-lease" }}
{{- if .Values.rbac.namespaced }}
{{- if has .Release.Namespace $system }}
{{- fail (printf "rbac.namespaced: the release namespace %s is a system namespace; install Terrace in a namespace of its own (e.g. terrace-system)" .Release.Namespace) }}
{{- end }}
{{- $out := list .Release.Namespace }}
{{- range $ns := .Values.watchNamespaces }}
{{- if has $ns $system }}
{{- fail (printf "watchNamespaces: %s is a system namespace: the namespaced mode keeps the controller's rights out of kube-system, kube-public and kube-node-lease" $ns) }}
{{- end }}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$" (toString $ns)) }}
{{- fail (printf "watchNamespaces: %q is not a namespace name" (toString $ns)) }}
{{- end }}
{{- $out = append $out $ns }}
{{- end }}
{{- join "," (uniq $out) }}
{{- else if .Values.watchNamespaces }}
{{- fail "watchNamespaces is set but rbac.namespaced is false: set rbac.namespaced=true to bind the controller's rights in those namespaces only, or leave watchNamespaces empty for the all-namespaces mode" }}
{{- end }}
{{- end }}

{{/*
Sharding (docs/sharding.md): each of sharding.shards is a Deployment of its
own, with its Service, PodDisruptionBudget and NetworkPolicy. Its objects
are named terrace-controller-<shard> and select its pods by the label
sharding.fluxcd.io/key; the main controller's keep the names and selector
of an unsharded install. Called with (list root shard); shard "" is the main one.
*/}}
{{- define "terrace.controllerName" -}}
{{- $shard := index . 1 -}}
{{- if $shard -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]{0,33}[a-z0-9])?$" (toString $shard)) -}}
{{- fail (printf "sharding.shards: %q must be a short DNS label (lowercase letters, digits and '-', at most 35 characters): it names the shard's Deployment and Service" (toString $shard)) -}}
{{- end -}}
terrace-controller-{{ $shard }}
{{- else -}}
terrace-controller
{{- end -}}
{{- end }}

{{- define "terrace.shardLabels" -}}
{{- $shard := index . 1 -}}
{{- if $shard -}}
{{ include "terrace.labels" (index . 0) | replace "app.kubernetes.io/component: controller" "app.kubernetes.io/component: controller-shard" }}
sharding.fluxcd.io/key: {{ $shard }}
{{- else -}}
{{ include "terrace.labels" (index . 0) }}
{{- end -}}
{{- end }}

{{- define "terrace.shardSelector" -}}
{{- $shard := index . 1 -}}
{{- if $shard -}}
app.kubernetes.io/name: terrace
app.kubernetes.io/component: controller-shard
sharding.fluxcd.io/key: {{ $shard }}
{{- else -}}
{{ include "terrace.selector" (index . 0) }}
{{- end -}}
{{- end }}
