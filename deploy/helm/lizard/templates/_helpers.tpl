{{/* The release's name for every object: "lizard" for a release named lizard, else release-lizard. */}}
{{- define "lizard.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "lizard.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "lizard.labels" -}}
{{ include "lizard.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The Secret the chart makes for credentials given as values. */}}
{{- define "lizard.credentialsSecret" -}}
{{- include "lizard.fullname" . }}-credentials
{{- end -}}

{{- define "lizard.clusterSecretName" -}}
{{- .Values.clusterSecret.existingSecret | default (printf "%s-cluster" (include "lizard.fullname" .)) -}}
{{- end -}}

{{- define "lizard.clusterSecretKey" -}}
{{- if .Values.clusterSecret.existingSecret -}}{{ .Values.clusterSecret.existingSecretKey }}{{- else -}}secret{{- end -}}
{{- end -}}

{{/* Fails the render early, naming the value, when something required is missing. */}}
{{- define "lizard.validate" -}}
{{- if not (or .Values.database.url .Values.database.existingSecret) -}}
{{- fail "database.url or database.existingSecret is required: the nodes share one PostgreSQL database (postgres://USER:PASSWORD@HOST:PORT/DB)" -}}
{{- end -}}
{{- if and .Values.database.url (not (hasPrefix "postgres" .Values.database.url)) -}}
{{- fail (printf "database.url %q: must be a postgres:// or postgresql:// URL" .Values.database.url) -}}
{{- end -}}
{{- if not .Values.objectStore.url -}}
{{- fail "objectStore.url is required: s3://BUCKET?endpoint=HOST:PORT&region=REGION (durable pauses and drain --move need it)" -}}
{{- end -}}
{{- if not (hasPrefix "s3://" .Values.objectStore.url) -}}
{{- fail (printf "objectStore.url %q: must be an s3:// URL" .Values.objectStore.url) -}}
{{- end -}}
{{- if and (not .Values.objectStore.existingSecret) (ne (empty .Values.objectStore.accessKeyId) (empty .Values.objectStore.secretAccessKey)) -}}
{{- fail "objectStore.accessKeyId and objectStore.secretAccessKey go together" -}}
{{- end -}}
{{- if and .Values.clusterSecret.value (lt (len .Values.clusterSecret.value) 32) -}}
{{- fail "clusterSecret.value: must be at least 32 bytes" -}}
{{- end -}}
{{- if not .Values.preview.domain -}}
{{- fail "preview.domain is required: previews are <sandbox>-<port>.<preview.domain>" -}}
{{- end -}}
{{- end -}}

{{/* The preview proxy's port: 443 when it serves TLS itself, else 80. */}}
{{- define "lizard.previewPort" -}}
{{- if .Values.preview.tlsSecret -}}443{{- else -}}80{{- end -}}
{{- end -}}
