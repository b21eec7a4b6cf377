{{- define "wharf.labels" -}}
app.kubernetes.io/name: wharf
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "wharf.selector" -}}
app.kubernetes.io/name: wharf
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}
