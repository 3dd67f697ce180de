{{- define "engram.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "engram.secretName" -}}
{{- .Values.secrets.existingSecret | default (include "engram.fullname" .) -}}
{{- end -}}

{{/* Labels of one service's objects; call with (dict "root" $ "service" $name). */}}
{{- define "engram.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{ include "engram.selector" . }}
{{- end -}}

{{- define "engram.selector" -}}
app.kubernetes.io/name: engram
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .service }}
{{- end -}}
