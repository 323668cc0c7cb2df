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
