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

{{/*
The port of tracing.otlpEndpoint: the URL's own, else 443 for https and 80
for http (as the OTLP exporter dials it).
*/}}
{{- define "telha-cascade.otlpPort" -}}
{{- $u := urlParse .Values.tracing.otlpEndpoint }}
{{- $hp := splitList ":" $u.host }}
{{- if gt (len $hp) 1 }}{{ last $hp }}{{ else if eq $u.scheme "https" }}443{{ else }}80{{ end }}
{{- end }}

{{/*
The port name of the read API and the status page: "api" with
service.apiPort, else "http".
*/}}
{{- define "telha-cascade.apiPortName" -}}
{{- if gt (int .Values.service.apiPort) 0 }}api{{ else }}http{{ end }}
{{- end }}

{{/*
"true" with ownership.mode dynamic (--partition-owner dynamic/<slots>),
"" with static (auto/<replicaCount>).
*/}}
{{- define "telha-cascade.dynamic" -}}
{{- if eq .Values.ownership.mode "dynamic" }}true{{ end }}
{{- end }}

{{/* What the StatefulSet records of the layout: ownership mode, changelog. */}}
{{- define "telha-cascade.changelogMode" -}}
{{- if or (include "telha-cascade.dynamic" .) .Values.changelog.enabled }}jetstream{{ else }}off{{ end }}
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
{{- if include "telha-cascade.dynamic" . }}
{{- $slots := int .Values.ownership.slots }}
{{- if gt $slots (int .Values.partitions) }}
{{- fail (printf "ownership.slots (%d) must be <= partitions (%d): slot i holds the partitions p with p %% slots == i, so extra slots would hold nothing" $slots (int .Values.partitions)) }}
{{- end }}
{{- if gt (int .Values.replicaCount) $slots }}
{{- fail (printf "ownership.mode=dynamic: replicaCount (%d) must be <= ownership.slots (%d): each pod owns whole slots, so extra pods would own nothing" (int .Values.replicaCount) $slots) }}
{{- end }}
{{- if gt (int .Values.service.apiPort) 0 }}
{{- fail "service.apiPort is not supported with ownership.mode=dynamic: a member serves the read API and the status page on service.port and forwards reads to the slot's owner there (the worker refuses --api-addr with --partition-owner dynamic). Set service.apiPort=0, or ownership.mode=static" }}
{{- end }}
{{- if and (gt (int .Values.replicaCount) 1) (ne .Values.auth.mode "off") (not .Values.auth.tokensSecret) }}
{{- fail (printf "ownership.mode=dynamic with replicaCount %d: reads are forwarded between pods (to the owner of the tenant's slot), and without tokens (auth.mode auto, auth.tokensSecret empty) a pod answers loopback clients only, so it would refuse every forwarded read. Set auth.tokensSecret (a Secret with tokens.json), or auth.mode=off" (int .Values.replicaCount)) }}
{{- end }}
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
{{- $svc := .Values.service }}
{{- if and (gt (int $svc.apiPort) 0) (eq (int $svc.apiPort) (int $svc.port)) }}
{{- fail (printf "service.apiPort (%d) must differ from service.port: it moves /v1 and /ui off the metrics port (0 keeps them there)" (int $svc.apiPort)) }}
{{- end }}
{{- if and .Values.networkPolicy.ingress.apiFrom (eq (int $svc.apiPort) 0) }}
{{- fail "networkPolicy.ingress.apiFrom needs service.apiPort: without it /v1 and /ui share the http port with /metrics, and networkPolicy.ingress.from governs that port" }}
{{- end }}
{{- $ing := .Values.ingress }}
{{- if $ing.enabled }}
{{- if not $ing.host }}
{{- fail "ingress.enabled: set ingress.host (with replicaCount N > 1, replica i is served as <i>.<host>)" }}
{{- end }}
{{- if and (ne .Values.auth.mode "off") (not .Values.auth.tokensSecret) }}
{{- fail "ingress.enabled needs auth.tokensSecret: without tokens the status page answers loopback clients only (kubectl port-forward), so every request through the Ingress would be refused" }}
{{- end }}
{{- end }}
{{- $reserved := list "data" "tmp" "auth-tokens" "nats-creds" "nats-tls" }}
{{- $volNames := list }}
{{- range .Values.extraVolumes }}
{{- if has .name $reserved }}
{{- fail (printf "extraVolumes: the name %q is the chart's own volume; choose another" .name) }}
{{- end }}
{{- if has .name $volNames }}
{{- fail (printf "extraVolumes: %q is named twice" .name) }}
{{- end }}
{{- $volNames = append $volNames .name }}
{{- end }}
{{- range .Values.extraVolumeMounts }}
{{- if not (has .name $volNames) }}
{{- fail (printf "extraVolumeMounts: %q names no volume of extraVolumes" .name) }}
{{- end }}
{{- $p := trimSuffix "/" .mountPath }}
{{- range list "/data" "/tmp" "/etc/telha" }}
{{- if or (eq $p .) (hasPrefix (printf "%s/" .) $p) }}
{{- fail (printf "extraVolumeMounts: %s would hide the chart's own %s mount" $p .) }}
{{- end }}
{{- end }}
{{- end }}
{{- $flags := list }}
{{- range (include "telha-cascade.args" . | fromYamlArray) }}
{{- $flags = append $flags (regexReplaceAll "=.*$" (toString .) "") }}
{{- end }}
{{- $chartEnv := list "POD_NAME" "POD_NAMESPACE" }}
{{- if $c.userKey }}
{{- $chartEnv = concat $chartEnv (list "TELHA_NATS_USER" "TELHA_NATS_PASSWORD") }}
{{- end }}
{{- range .Values.extraEnv }}
{{- if has .name $chartEnv }}
{{- fail (printf "extraEnv: %s is set by the chart" .name) }}
{{- end }}
{{- if hasPrefix "TELHA_" .name }}
{{- $flag := printf "--%s" (trimPrefix "TELHA_" .name | lower | replace "_" "-") }}
{{- if has $flag $flags }}
{{- fail (printf "extraEnv: %s would be ignored, the chart passes %s on the command line (which wins): set the chart's value (or extraArgs) instead" .name $flag) }}
{{- end }}
{{- end }}
{{- end }}
{{- /*
The layout of the running release, as its StatefulSet records it
(telha.io/* annotations; a StatefulSet of the chart before ownership.mode
records only partitions and replicas: static, without the changelog).
`helm template` and --dry-run=client see no cluster and skip this.
*/}}
{{- if not .Values.allowTopologyChange }}
{{- $existing := lookup "apps/v1" "StatefulSet" .Release.Namespace (include "telha-cascade.fullname" .) }}
{{- if $existing }}
{{- $ann := default (dict) $existing.metadata.annotations }}
{{- $oldP := index $ann "telha.io/partitions" | default "" }}
{{- $oldN := index $ann "telha.io/replicas" | default "" }}
{{- $oldMode := index $ann "telha.io/ownership" | default "static" }}
{{- $oldLog := index $ann "telha.io/changelog" | default "off" }}
{{- $oldSlots := index $ann "telha.io/slots" | default "" }}
{{- $n := int .Values.replicaCount }}
{{- $slots := int .Values.ownership.slots }}
{{- if and $oldP (ne $oldP (toString (int .Values.partitions))) }}
{{- fail (printf "partitions is fixed at install (%s, requested %d): changing it moves tenants between replicas' stores. See docs/DEPLOY.md (data move), then set allowTopologyChange=true" $oldP (int .Values.partitions)) }}
{{- end }}
{{- if include "telha-cascade.dynamic" . }}
{{- if eq $oldMode "static" }}
{{- if ne $oldLog "jetstream" }}
{{- fail (printf "ownership.mode=dynamic: this release runs static ownership without the changelog (replicaCount %s), so each replica's data is on its volume only, where a member would not read it. Upgrade in two steps: first `helm upgrade` with ownership.mode=static and changelog.enabled=true (it seeds each replica's changelog; wait until every pod is ready), then to ownership.mode=dynamic with ownership.slots=%s (the old replicaCount). See docs/DEPLOY.md" ($oldN | default "?") ($oldN | default "<old replicaCount>")) }}
{{- end }}
{{- if and $oldN (ne $oldN (toString $slots)) }}
{{- fail (printf "ownership.slots (%d) must equal the static replicaCount (%s) when switching to dynamic: slot i takes over static replica i's changelog (TELHA_LOG_STATIC%s_<i>). Set ownership.slots=%s" $slots $oldN $oldN $oldN) }}
{{- end }}
{{- else if and $oldSlots (ne $oldSlots (toString $slots)) }}
{{- fail (printf "ownership.slots is fixed at install (%s, requested %d): each slot has its own changelog (TELHA_LOG_STATIC%s_<i>). Change replicaCount instead (any number up to %s), or see docs/DEPLOY.md (data move), then set allowTopologyChange=true" $oldSlots $slots $oldSlots $oldSlots) }}
{{- end }}
{{- else if eq $oldMode "dynamic" }}
{{- if not .Values.changelog.enabled }}
{{- fail "ownership.mode=static: this release runs dynamic ownership, whose writes are in the changelog and not in the static stores; going back to static needs changelog.enabled=true (each replica replays its slot's changelog)" }}
{{- end }}
{{- if and $oldSlots (ne $oldSlots (toString $n)) }}
{{- fail (printf "ownership.mode=static: replicaCount (%d) must equal the dynamic release's ownership.slots (%s): static replica i takes over slot i's changelog (TELHA_LOG_STATIC%s_<i>). Set replicaCount=%s" $n $oldSlots $oldSlots $oldSlots) }}
{{- end }}
{{- else if and $oldN (ne $oldN (toString $n)) }}
{{- fail (printf "replicaCount changes partition ownership (%s -> %d) and the new owners do not have the data. See docs/DEPLOY.md (Scaling), then set allowTopologyChange=true" $oldN $n) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The worker's command line, one "- arg" per line: rendered into the
StatefulSet and read back by telha-cascade.validate (which refuses an
extraEnv TELHA_* variable for a flag given here: the command line wins, so
the variable would be silently ignored).
*/}}
{{- define "telha-cascade.args" -}}
{{- $creds := .Values.nats.credentialsSecret }}
{{- $tls := .Values.nats.tls -}}
- --data-dir=/data
- --http-addr=:{{ int .Values.service.port }}
{{- if gt (int .Values.service.apiPort) 0 }}
- --api-addr=:{{ int .Values.service.apiPort }}
{{- end }}
{{- with .Values.tracing.otlpEndpoint }}
- {{ printf "--otlp-endpoint=%s" . | quote }}
{{- end }}
- {{ printf "--nats-url=%s" (required "nats.url is required: the worker must use the external NATS cluster in Kubernetes" .Values.nats.url) | quote }}
{{- if gt (int .Values.nats.streamReplicas) 0 }}
- --stream-replicas={{ int .Values.nats.streamReplicas }}
{{- end }}
- --partitions={{ int .Values.partitions }}
{{- $log := .Values.changelog }}
{{- if include "telha-cascade.dynamic" . }}
{{- $own := .Values.ownership }}
- --partition-owner=dynamic/{{ int $own.slots }}
- --member-id=$(POD_NAME)
- {{ printf "--advertise-url=http://$(POD_NAME).%s.%s.svc.%s:%d" (include "telha-cascade.headlessName" .) .Release.Namespace .Values.clusterDomain (int .Values.service.port) | quote }}
- --standbys={{ int $own.standbys }}
- {{ printf "--member-ttl=%s" $own.memberTTL | quote }}
- {{ printf "--forward-wait=%s" $own.forwardWait | quote }}
{{- else }}
- --partition-owner=auto/{{ int .Values.replicaCount }}
{{- end }}
{{- if or (include "telha-cascade.dynamic" .) $log.enabled }}
- --changelog=jetstream
{{- if gt (int $log.replicas) 0 }}
- --changelog-replicas={{ int $log.replicas }}
{{- end }}
- {{ printf "--checkpoint-schedule=%s" $log.checkpointSchedule | quote }}
- --checkpoints-keep={{ int $log.checkpointsKeep }}
{{- if $log.uploadRate }}
- {{ printf "--checkpoint-upload-rate=%v" $log.uploadRate | quote }}
{{- end }}
{{- end }}
- --max-batch-ops={{ int64 .Values.maxBatchOps }}
{{- if gt (int64 .Values.journalChunkOps) 0 }}
- --journal-chunk-ops={{ int64 .Values.journalChunkOps }}
{{- end }}
{{- if .Values.secureDeleteRequests }}
- --secure-delete-requests
{{- end }}
{{- if eq .Values.auth.mode "off" }}
- --auth=off
{{- else if .Values.auth.tokensSecret }}
- --auth-tokens-file=/etc/telha/auth/tokens.json
{{- end }}
- --max-deliver={{ int .Values.maxDeliver }}
- --max-deaths={{ int .Values.maxDeaths }}
- {{ printf "--ack-wait=%s" .Values.ackWait | quote }}
- {{ printf "--shutdown-grace=%s" .Values.shutdownGrace | quote }}
- {{ printf "--results-max-age=%s" .Values.resultsMaxAge | quote }}
- {{ printf "--dlq-max-age=%s" .Values.dlqMaxAge | quote }}
- {{ printf "--results-max-bytes=%s" (toString .Values.nats.resultsMaxBytes) | quote }}
- {{ printf "--dlq-max-bytes=%s" (toString .Values.nats.dlqMaxBytes) | quote }}
- --results-max-per-tenant={{ int64 .Values.nats.resultsMaxPerTenant }}
- --dlq-max-per-tenant={{ int64 .Values.nats.dlqMaxPerTenant }}
- {{ printf "--reaper-schedule=%s" .Values.reaperSchedule | quote }}
- --log-format={{ .Values.logFormat }}
{{- if and $creds.name $creds.credsKey }}
- --nats-creds=/etc/telha/nats-creds/nats.creds
{{- end }}
{{- if $tls.enabled }}
{{- if $tls.caKey }}
- --nats-tls-ca=/etc/telha/nats-tls/ca.crt
{{- end }}
{{- if $tls.certKey }}
- --nats-tls-cert=/etc/telha/nats-tls/tls.crt
- --nats-tls-key=/etc/telha/nats-tls/tls.key
{{- end }}
{{- end }}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}
