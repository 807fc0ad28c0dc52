{{- define "gpufabric.name" -}}
{{ .Release.Name }}-operator
{{- end }}
{{- define "gpufabric.labels" -}}
app.kubernetes.io/name: fabric-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}
{{- define "gpufabric.selector" -}}
app.kubernetes.io/name: fabric-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}
{{/* The namespace the operator creates benchmark pods in. */}}
{{- define "gpufabric.podNamespace" -}}
{{ .Release.Namespace }}
{{- end }}
{{/* repository:tag, or repository@digest when a digest is given (the tag is then moot). */}}
{{- define "gpufabric.imageRef" -}}
{{- if .image.digest -}}
{{ .image.repository }}@{{ .image.digest }}
{{- else -}}
{{ .image.repository }}:{{ .image.tag | default (printf "v%s" .appVersion) }}
{{- end }}
{{- end }}
{{- define "gpufabric.image" -}}
{{ include "gpufabric.imageRef" (dict "image" .Values.image "appVersion" .Chart.AppVersion) }}
{{- end }}
{{- define "gpufabric.agentImage" -}}
{{ include "gpufabric.imageRef" (dict "image" .Values.agentImage "appVersion" .Chart.AppVersion) }}
{{- end }}
