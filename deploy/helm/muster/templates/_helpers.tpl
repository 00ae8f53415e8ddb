{{- define "muster.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}
{{/* The prefix of every object name: the release name, with "-muster" unless it already says
muster, so two releases in one namespace never share an object (the default release "muster"
gives the plain manifests' names). */}}
{{- define "muster.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- define "muster.labels" -}}
app.kubernetes.io/instance: {{ .Release.Name }}
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

{{/* The adapter's Lease: adapter.leaderElection.leaseName, else <fullname>-k8s-adapter-<backend>. */}}
{{- define "muster.leaseName" -}}
{{- .Values.adapter.leaderElection.leaseName | default (printf "%s-k8s-adapter-%s" (include "muster.fullname" .) .Values.adapter.backendName) -}}
{{- end -}}
