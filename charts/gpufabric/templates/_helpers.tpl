{{- define "gpufabric.labels" -}}
app.kubernetes.io/name: fabric-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
{{- define "gpufabric.selector" -}}
app.kubernetes.io/name: fabric-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}
