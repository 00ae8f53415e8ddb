{{- define "muster.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}
{{- define "muster.labels" -}}
app.kubernetes.io/part-of: muster
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}
