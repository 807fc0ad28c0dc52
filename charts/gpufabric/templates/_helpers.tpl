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
{{- define "gpufabric.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default (printf "v%s" .Chart.AppVersion) }}
{{- end }}
{{- define "gpufabric.agentImage" -}}
{{ .Values.agentImage.repository }}:{{ .Values.agentImage.tag | default (printf "v%s" .Chart.AppVersion) }}
{{- end }}
