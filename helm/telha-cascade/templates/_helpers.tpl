{{/* Chart name. */}}
{{- define "telha-cascade.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name. StatefulSet pod names get "-<ordinal>" appended and the pod's
hostname carries that suffix (the worker's --partition-owner auto/N reads it),
so keep the name short enough for DNS labels.
*/}}
{{- define "telha-cascade.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "telha-cascade.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "telha-cascade.headlessName" -}}
{{- printf "%s-headless" (include "telha-cascade.fullname" .) }}
{{- end }}

{{/* Labels on every object. Versions live here, never in selectors. */}}
{{- define "telha-cascade.labels" -}}
helm.sh/chart: {{ include "telha-cascade.chart" . }}
{{ include "telha-cascade.selectorLabels" . }}
app.kubernetes.io/version: {{ (default .Chart.AppVersion .Values.image.tag) | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: telha
{{- end }}

{{/* Selector labels: stable across upgrades (no chart or app version). */}}
{{- define "telha-cascade.selectorLabels" -}}
app.kubernetes.io/name: {{ include "telha-cascade.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: worker
{{- end }}

{{- define "telha-cascade.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "telha-cascade.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "telha-cascade.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end }}
{{- end }}

{{/* Label matchers that select this release's series in alert expressions. */}}
{{- define "telha-cascade.alertSelector" -}}
{{- if .Values.prometheusRule.selector -}}
{{ .Values.prometheusRule.selector }}
{{- else -}}
job="{{ include "telha-cascade.fullname" . }}",namespace="{{ .Release.Namespace }}"
{{- end }}
{{- end }}

{{/*
Checks of combinations the schema cannot express. Included by the
StatefulSet so that every render runs them.
*/}}
{{- define "telha-cascade.validate" -}}
{{- if gt (int .Values.replicaCount) (int .Values.partitions) }}
{{- fail (printf "replicaCount (%d) must be <= partitions (%d): replica i owns partitions p with p %% N == i, so extra replicas would own nothing" (int .Values.replicaCount) (int .Values.partitions)) }}
{{- end }}
{{- $c := .Values.nats.credentialsSecret }}
{{- if $c.name }}
{{- if and $c.credsKey (or $c.userKey $c.passwordKey) }}
{{- fail "nats.credentialsSecret: set either credsKey or userKey+passwordKey, not both" }}
{{- end }}
{{- if and (not $c.credsKey) (not (and $c.userKey $c.passwordKey)) }}
{{- fail "nats.credentialsSecret.name is set: also set credsKey, or both userKey and passwordKey" }}
{{- end }}
{{- else if or $c.credsKey $c.userKey $c.passwordKey }}
{{- fail "nats.credentialsSecret: keys are set but name (the Secret) is empty" }}
{{- end }}
{{- $t := .Values.nats.tls }}
{{- if $t.enabled }}
{{- if not $t.secretName }}
{{- fail "nats.tls.enabled: set nats.tls.secretName" }}
{{- end }}
{{- if not (or (and $t.certKey $t.keyKey) (and (not $t.certKey) (not $t.keyKey))) }}
{{- fail "nats.tls: set both certKey and keyKey (mutual TLS) or neither (server-only TLS)" }}
{{- end }}
{{- if and (not $t.caKey) (not $t.certKey) }}
{{- fail "nats.tls.enabled: set caKey and/or certKey+keyKey" }}
{{- end }}
{{- end }}
{{- $pdb := .Values.podDisruptionBudget }}
{{- if $pdb.enabled }}
{{- if and (kindIs "invalid" $pdb.maxUnavailable) (kindIs "invalid" $pdb.minAvailable) }}
{{- fail "podDisruptionBudget: set one of maxUnavailable and minAvailable" }}
{{- end }}
{{- end }}
{{- if not .Values.allowTopologyChange }}
{{- $existing := lookup "apps/v1" "StatefulSet" .Release.Namespace (include "telha-cascade.fullname" .) }}
{{- if $existing }}
{{- $ann := default (dict) $existing.metadata.annotations }}
{{- $oldP := index $ann "telha.io/partitions" | default "" }}
{{- $oldN := index $ann "telha.io/replicas" | default "" }}
{{- if and $oldP (ne $oldP (toString (int .Values.partitions))) }}
{{- fail (printf "partitions is fixed at install (%s, requested %d): changing it moves tenants between replicas' stores. See docs/DEPLOY.md (data move), then set allowTopologyChange=true" $oldP (int .Values.partitions)) }}
{{- end }}
{{- if and $oldN (ne $oldN (toString (int .Values.replicaCount))) }}
{{- fail (printf "replicaCount changes partition ownership (%s -> %d) and the new owners do not have the data. See docs/DEPLOY.md (Scaling), then set allowTopologyChange=true" $oldN (int .Values.replicaCount)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
