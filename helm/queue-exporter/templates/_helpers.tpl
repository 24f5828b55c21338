{{/*
Named templates. Those that build the exporter's container read only .Values, .Release and
.Chart, so a parent chart that has this chart as a dependency can include them with the
subchart's own context: (index .Subcharts "queue-exporter").
*/}}

{{- define "queue-exporter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "queue-exporter.fullname" -}}
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

{{- define "queue-exporter.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "queue-exporter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "queue-exporter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "queue-exporter.labels" -}}
helm.sh/chart: {{ include "queue-exporter.chart" . }}
{{ include "queue-exporter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: metrics
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The pods that serve /metrics: the exporter's own, or the workers that carry it. */}}
{{- define "queue-exporter.podSelector" -}}
{{- if eq .Values.mode "sidecar" }}
{{- if not .Values.sidecar.podSelector }}
{{- fail "sidecar.podSelector is required in sidecar mode: the labels of the worker pods that carry the exporter" }}
{{- end }}
{{- toYaml .Values.sidecar.podSelector }}
{{- else }}
{{- include "queue-exporter.selectorLabels" . }}
{{- end }}
{{- end }}

{{- define "queue-exporter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "queue-exporter.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "queue-exporter.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/* HTTP or HTTPS: how probes and Prometheus reach /metrics. */}}
{{- define "queue-exporter.scheme" -}}
{{- if and .Values.webConfig.enabled .Values.webConfig.tls }}HTTPS{{ else }}HTTP{{ end }}
{{- end }}

{{/* Secrets: an existing one, or the chart's own when the credential is given in values. */}}
{{- define "queue-exporter.redisSecretName" -}}
{{- if .Values.redisAuth.existingSecret }}
{{- if not (or .Values.redisAuth.existingSecretPasswordKey .Values.redisAuth.existingSecretSentinelPasswordKey) }}
{{- fail "redisAuth.existingSecret is set but names no key: set existingSecretPasswordKey, existingSecretSentinelPasswordKey or both" }}
{{- end }}
{{- .Values.redisAuth.existingSecret }}
{{- else if or .Values.redisAuth.password .Values.redisAuth.sentinelPassword }}
{{- printf "%s-redis" (include "queue-exporter.fullname" .) }}
{{- end }}
{{- end }}

{{/* Which of the Redis Secret's keys are mounted: "true" or empty. An existing Secret's key
is mounted only when its key is named, so a Secret may hold the Sentinels' password alone. */}}
{{- define "queue-exporter.hasRedisPassword" -}}
{{- if .Values.redisAuth.existingSecret }}
{{- if .Values.redisAuth.existingSecretPasswordKey }}true{{ end }}
{{- else if .Values.redisAuth.password }}true{{ end }}
{{- end }}

{{- define "queue-exporter.hasSentinelPassword" -}}
{{- if .Values.redisAuth.existingSecret }}
{{- if .Values.redisAuth.existingSecretSentinelPasswordKey }}true{{ end }}
{{- else if .Values.redisAuth.sentinelPassword }}true{{ end }}
{{- end }}

{{- define "queue-exporter.postgresSecretName" -}}
{{- if .Values.postgresAuth.existingSecret }}
{{- .Values.postgresAuth.existingSecret }}
{{- else if .Values.postgresAuth.dsn }}
{{- printf "%s-postgres" (include "queue-exporter.fullname" .) }}
{{- end }}
{{- end }}

{{- define "queue-exporter.webConfigSecretName" -}}
{{- if .Values.webConfig.existingSecret }}
{{- .Values.webConfig.existingSecret }}
{{- else }}
{{- printf "%s-web-config" (include "queue-exporter.fullname" .) }}
{{- end }}
{{- end }}

{{- define "queue-exporter.configMapName" -}}
{{- printf "%s-config" (include "queue-exporter.fullname" .) }}
{{- end }}

{{/*
The exporter's configuration file: .Values.config with what the chart decides set on top
(listen address, web config file, credential files).
*/}}
{{- define "queue-exporter.config" -}}
{{- $config := deepCopy (.Values.config | default dict) }}
{{- $_ := set $config "listen_address" (printf "0.0.0.0:%d" (int .Values.port)) }}
{{- /* Several exporters (replicas, or one sidecar per worker pod): sample on one of them. */}}
{{- if and (not (hasKey $config "leader_election")) (or (eq .Values.mode "sidecar") (gt (int .Values.replicaCount) 1)) }}
{{- $_ := set $config "leader_election" (dict "enabled" true) }}
{{- end }}
{{- if .Values.webConfig.enabled }}
{{- $_ := set $config "web_config_file" "/etc/queue-exporter/web/web-config.yml" }}
{{- end }}
{{- $sources := get $config "sources" | default dict }}
{{- if include "queue-exporter.redisSecretName" . }}
{{- $redis := get $sources "redis" | default dict }}
{{- /* Several Redis (a list): the mounted passwords are each one's (a URL that names no
Sentinel ignores the Sentinels' password). */}}
{{- range (kindIs "slice" $redis | ternary $redis (list $redis)) }}
{{- if include "queue-exporter.hasRedisPassword" $ }}
{{- $_ := set . "password_file" "/etc/queue-exporter/redis/password" }}
{{- end }}
{{- if include "queue-exporter.hasSentinelPassword" $ }}
{{- $_ := set . "sentinel_password_file" "/etc/queue-exporter/redis/sentinel-password" }}
{{- end }}
{{- end }}
{{- $_ := set $sources "redis" $redis }}
{{- end }}
{{- if include "queue-exporter.postgresSecretName" . }}
{{- $postgres := get $sources "postgres" | default dict }}
{{- $_ := set $postgres "dsn_file" "/etc/queue-exporter/postgres/dsn" }}
{{- $_ := set $sources "postgres" $postgres }}
{{- end }}
{{- with include "queue-exporter.tlsFiles" (dict "tls" .Values.redisTLS "backend" "redis") | fromYaml }}
{{- $files := dict "tls_ca_file" .ca "tls_cert_file" .cert "tls_key_file" .key }}
{{- $redis := get $sources "redis" | default dict }}
{{- $events := get $sources "events" | default dict }}
{{- range (kindIs "slice" $redis | ternary $redis (list $redis)) }}
{{- include "queue-exporter.setFiles" (dict "into" . "files" $files) }}
{{- end }}
{{- $_ := set $sources "redis" $redis }}
{{- with get $events "redis" }}
{{- include "queue-exporter.setFiles" (dict "into" . "files" $files) }}
{{- end }}
{{- end }}
{{- with include "queue-exporter.tlsFiles" (dict "tls" .Values.postgresTLS "backend" "postgres") | fromYaml }}
{{- $postgres := get $sources "postgres" | default dict }}
{{- include "queue-exporter.setFiles" (dict "into" $postgres "files" (dict "sslrootcert" .ca "sslcert" .cert "sslkey" .key)) }}
{{- if and .ca (not (hasKey $postgres "sslmode")) }}
{{- $_ := set $postgres "sslmode" "verify-full" }}
{{- end }}
{{- $_ := set $sources "postgres" $postgres }}
{{- end }}
{{- if $sources }}
{{- $_ := set $config "sources" $sources }}
{{- end }}
{{- toYaml $config }}
{{- end }}

{{/*
Where a backend's TLS files are mounted (YAML: ca, cert, key; empty when none of them is):
the volume "queue-exporter.tlsVolume" lays them out so.
*/}}
{{- define "queue-exporter.tlsFiles" -}}
{{- $dir := printf "/etc/queue-exporter/%s-tls" .backend }}
{{- with .tls.caSecret }}
ca: {{ $dir }}/ca.crt
{{- end }}
{{- with .tls.clientCertSecret }}
cert: {{ $dir }}/client.crt
key: {{ $dir }}/client.key
{{- end }}
{{- end }}

{{/* Sets each of .files (setting: path) that has a path on the dict .into. */}}
{{- define "queue-exporter.setFiles" -}}
{{- range $setting, $path := .files }}
{{- if $path }}
{{- $_ := set $.into $setting $path }}
{{- end }}
{{- end }}
{{- end }}

{{/*
A backend's TLS material as one projected volume, its CA and client certificate from their
Secrets. libpq refuses a client key readable by others than its owner's group: the key is
0440 in both modes (in sidecar mode, the worker pod then needs an fsGroup of the exporter's
group to read it).
*/}}
{{- define "queue-exporter.tlsVolume" -}}
{{- if or .tls.caSecret .tls.clientCertSecret }}
- name: queue-exporter-{{ .backend }}-tls
  projected:
    defaultMode: {{ .mode }}
    sources:
      {{- with .tls.caSecret }}
      - secret:
          name: {{ . }}
          items:
            - key: {{ $.tls.caKey }}
              path: ca.crt
      {{- end }}
      {{- with .tls.clientCertSecret }}
      - secret:
          name: {{ . }}
          items:
            - key: {{ $.tls.certKey }}
              path: client.crt
            - key: {{ $.tls.keyKey }}
              path: client.key
              mode: 288
      {{- end }}
{{- end }}
{{- end }}

{{/* OTEL_RESOURCE_ATTRIBUTES: the pod's name and namespace (downward API), then the values'. */}}
{{- define "queue-exporter.otelResourceAttributes" -}}
{{- $attributes := list "k8s.pod.name=$(POD_NAME)" "k8s.namespace.name=$(POD_NAMESPACE)" }}
{{- range $key, $value := .Values.otelResourceAttributes }}
{{- $attributes = append $attributes (printf "%s=%s" $key $value) }}
{{- end }}
{{- join "," $attributes }}
{{- end }}

{{/* Pod annotations that roll the pods when the configuration changes. */}}
{{- define "queue-exporter.podAnnotations" -}}
checksum/queue-exporter-config: {{ include "queue-exporter.config" . | sha256sum }}
{{- end }}

{{- define "queue-exporter.probe" -}}
{{- $probe := deepCopy .probe }}
{{- if $probe.httpGet }}
{{- $_ := set $probe.httpGet "port" .root.Values.portName }}
{{- $_ := set $probe.httpGet "scheme" (include "queue-exporter.scheme" .root) }}
{{- end }}
{{- toYaml $probe }}
{{- end }}

{{/*
The exporter's container, as a one-item list: put it under a pod's `containers:`.
Deployment mode uses it; in sidecar mode the user's worker pod template includes it.
*/}}
{{- define "queue-exporter.container" -}}
- name: queue-exporter
  image: {{ include "queue-exporter.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args:
    - serve
    - --config=/etc/queue-exporter/config/config.yml
    {{- with .Values.extraArgs }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - name: {{ .Values.portName }}
      containerPort: {{ .Values.port }}
      protocol: TCP
  env:
    # The consumer name in the events' consumer group: one per pod.
    - name: POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    - name: POD_NAMESPACE
      valueFrom:
        fieldRef:
          fieldPath: metadata.namespace
    # The OTLP push's resource (the SDK reads it); $(VAR) refers to the variables above.
    - name: OTEL_RESOURCE_ATTRIBUTES
      value: {{ include "queue-exporter.otelResourceAttributes" . | quote }}
    {{- with .Values.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with .Values.livenessProbe }}
  livenessProbe:
    {{- include "queue-exporter.probe" (dict "probe" . "root" $) | nindent 4 }}
  {{- end }}
  {{- with .Values.readinessProbe }}
  readinessProbe:
    {{- include "queue-exporter.probe" (dict "probe" . "root" $) | nindent 4 }}
  {{- end }}
  {{- with .Values.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  volumeMounts:
    - name: queue-exporter-config
      mountPath: /etc/queue-exporter/config
      readOnly: true
    - name: queue-exporter-tmp
      mountPath: /tmp
    {{- if include "queue-exporter.redisSecretName" . }}
    - name: queue-exporter-redis
      mountPath: /etc/queue-exporter/redis
      readOnly: true
    {{- end }}
    {{- if include "queue-exporter.postgresSecretName" . }}
    - name: queue-exporter-postgres
      mountPath: /etc/queue-exporter/postgres
      readOnly: true
    {{- end }}
    {{- range $backend, $tls := dict "redis" .Values.redisTLS "postgres" .Values.postgresTLS }}
    {{- if or $tls.caSecret $tls.clientCertSecret }}
    - name: queue-exporter-{{ $backend }}-tls
      mountPath: /etc/queue-exporter/{{ $backend }}-tls
      readOnly: true
    {{- end }}
    {{- end }}
    {{- if .Values.webConfig.enabled }}
    - name: queue-exporter-web
      mountPath: /etc/queue-exporter/web
      readOnly: true
    {{- if .Values.webConfig.tlsSecret }}
    - name: queue-exporter-tls
      mountPath: /etc/queue-exporter/tls
      readOnly: true
    {{- end }}
    {{- end }}
    {{- with .Values.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}

{{/*
The volumes the container mounts, as list items: put them under the pod's `volumes:`.
Secret files are readable by the pod's fsGroup only in deployment mode, where the chart sets
it; a worker pod may have none, so there they are world-readable inside the container.
*/}}
{{- define "queue-exporter.volumes" -}}
{{- $mode := ternary 288 292 (eq .Values.mode "deployment") -}}
- name: queue-exporter-config
  configMap:
    name: {{ include "queue-exporter.configMapName" . }}
    items:
      - key: config.yml
        path: config.yml
- name: queue-exporter-tmp
  emptyDir:
    sizeLimit: 64Mi
{{- with include "queue-exporter.redisSecretName" . }}
- name: queue-exporter-redis
  secret:
    secretName: {{ . }}
    defaultMode: {{ $mode }}
    items:
      {{- if include "queue-exporter.hasRedisPassword" $ }}
      - key: {{ if $.Values.redisAuth.existingSecret }}{{ $.Values.redisAuth.existingSecretPasswordKey }}{{ else }}redis-password{{ end }}
        path: password
      {{- end }}
      {{- if include "queue-exporter.hasSentinelPassword" $ }}
      - key: {{ if $.Values.redisAuth.existingSecret }}{{ $.Values.redisAuth.existingSecretSentinelPasswordKey }}{{ else }}sentinel-password{{ end }}
        path: sentinel-password
      {{- end }}
{{- end }}
{{- with include "queue-exporter.postgresSecretName" . }}
- name: queue-exporter-postgres
  secret:
    secretName: {{ . }}
    defaultMode: {{ $mode }}
    items:
      - key: {{ if $.Values.postgresAuth.existingSecret }}{{ $.Values.postgresAuth.existingSecretDsnKey }}{{ else }}dsn{{ end }}
        path: dsn
{{- end }}
{{- if .Values.webConfig.enabled }}
- name: queue-exporter-web
  secret:
    secretName: {{ include "queue-exporter.webConfigSecretName" . }}
    defaultMode: {{ $mode }}
    items:
      - key: {{ if .Values.webConfig.existingSecret }}{{ .Values.webConfig.existingSecretKey }}{{ else }}web-config.yml{{ end }}
        path: web-config.yml
{{- with .Values.webConfig.tlsSecret }}
- name: queue-exporter-tls
  secret:
    secretName: {{ . }}
    defaultMode: {{ $mode }}
{{- end }}
{{- end }}
{{- include "queue-exporter.tlsVolume" (dict "tls" .Values.redisTLS "backend" "redis" "mode" $mode) }}
{{- include "queue-exporter.tlsVolume" (dict "tls" .Values.postgresTLS "backend" "postgres" "mode" $mode) }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* What a ServiceMonitor endpoint and a PodMonitor endpoint share. */}}
{{- define "queue-exporter.monitorEndpoint" -}}
interval: {{ .monitor.interval }}
scrapeTimeout: {{ .monitor.scrapeTimeout }}
{{- if eq (include "queue-exporter.scheme" .root) "HTTPS" }}
scheme: https
{{- with .monitor.tlsConfig }}
tlsConfig:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
relabelings:
  # One job label whatever the Service or pod is called: the shipped rules select on it.
  - action: replace
    targetLabel: job
    replacement: {{ .root.Values.metricsJob }}
  {{- with .monitor.relabelings }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .monitor.metricRelabelings }}
metricRelabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
