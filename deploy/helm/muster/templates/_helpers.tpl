{{- define "muster.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}
{{- define "muster.labels" -}}
app.kubernetes.io/part-of: muster
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{/* "true" when the server keeps its state in PostgreSQL (replicas share it), else "". */}}
{{- define "muster.postgres" -}}
{{- if .Values.server.state.postgres.dsnSecret.name -}}true{{- end -}}
{{- end -}}

{{/* The server's replicas: server.replicaCount, else 3 with PostgreSQL and 1 with SQLite. Two
servers on one SQLite file would both write it: refused with a message. */}}
{{- define "muster.serverReplicas" -}}
{{- $replicas := 1 -}}
{{- if kindIs "invalid" .Values.server.replicaCount -}}
{{- if include "muster.postgres" . -}}{{- $replicas = 3 -}}{{- end -}}
{{- else -}}
{{- $replicas = int .Values.server.replicaCount -}}
{{- end -}}
{{- if and (gt $replicas 1) (not (include "muster.postgres" .)) -}}
{{- fail (printf "server.replicaCount=%d needs PostgreSQL state (server.state.postgres.dsnSecret.name): replicas must never share one SQLite file" $replicas) -}}
{{- end -}}
{{- $replicas -}}
{{- end -}}

{{/* The adapter's Lease: adapter.leaderElection.leaseName, else muster-k8s-adapter-<backend>. */}}
{{- define "muster.leaseName" -}}
{{- .Values.adapter.leaderElection.leaseName | default (printf "muster-k8s-adapter-%s" .Values.adapter.backendName) -}}
{{- end -}}
