{{/* The chart's name, or nameOverride. */}}
{{- define "palisade.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release's name for its objects (63 characters at most: some name fields are DNS labels):
fullnameOverride, or the release name when it contains the chart's name, or RELEASE-NAME.
*/}}
{{- define "palisade.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "palisade.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "palisade.labels" -}}
helm.sh/chart: {{ include "palisade.chart" . }}
{{ include "palisade.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "palisade.selectorLabels" -}}
app.kubernetes.io/name: {{ include "palisade.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The service account the agent runs as: the chart's, or one the user made. */}}
{{- define "palisade.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "palisade.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name: the existing service account the agent runs as (serviceAccount.create is false)" .Values.serviceAccount.name }}
{{- end }}
{{- end }}
