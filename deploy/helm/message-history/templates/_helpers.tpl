{{/* Names ------------------------------------------------------------------------------------------------ */}}

{{- define "message-history.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "message-history.fullname" -}}
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

{{- define "message-history.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The paths each workload runs: ["both"] or ["recall", "persist"]. */}}
{{- define "message-history.paths" -}}
{{- if eq .Values.paths "split" }}recall persist{{ else }}both{{ end }}
{{- end }}

{{/* Name of the workload of one path. Call with (dict "root" $ "path" $path). */}}
{{- define "message-history.workloadName" -}}
{{- $full := include "message-history.fullname" .root }}
{{- if eq .path "both" }}{{ $full }}{{ else }}{{ printf "%s-%s" ($full | trunc 55 | trimSuffix "-") .path }}{{ end }}
{{- end }}

{{/* Labels -------------------------------------------------------------------------------------------------- */}}

{{- define "message-history.selectorLabels" -}}
app.kubernetes.io/name: {{ include "message-history.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "message-history.labels" -}}
helm.sh/chart: {{ include "message-history.chart" . }}
{{ include "message-history.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector of one path's pods. Call with (dict "root" $ "path" $path). */}}
{{- define "message-history.workloadSelectorLabels" -}}
{{ include "message-history.selectorLabels" .root }}
app.kubernetes.io/component: service
message-history/path: {{ .path }}
{{- end }}

{{/* Image, service account, secrets ------------------------------------------------------------------------ */}}

{{- define "message-history.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{- define "message-history.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "message-history.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "message-history.mongodbUriSecretName" -}}
{{- if .Values.mongodb.uriSecret.name }}{{ .Values.mongodb.uriSecret.name }}
{{- else if .Values.secrets.create }}{{ include "message-history.fullname" . }}
{{- else }}{{ printf "%s-mongodb" (include "message-history.fullname" .) }}
{{- end }}
{{- end }}

{{- define "message-history.mongodbUriSecretKey" -}}
{{- if or .Values.mongodb.uriSecret.name (not .Values.secrets.create) }}{{ .Values.mongodb.uriSecret.key }}{{ else }}mongodb-uri{{ end }}
{{- end }}

{{- define "message-history.kafkaPasswordSecretName" -}}
{{- if .Values.kafka.sasl.passwordSecret.name }}{{ .Values.kafka.sasl.passwordSecret.name }}
{{- else if and .Values.secrets.create .Values.secrets.kafkaSaslPassword }}{{ include "message-history.fullname" . }}
{{- end }}
{{- end }}

{{- define "message-history.kafkaPasswordSecretKey" -}}
{{- if .Values.kafka.sasl.passwordSecret.name }}{{ .Values.kafka.sasl.passwordSecret.key }}{{ else }}kafka-sasl-password{{ end }}
{{- end }}

{{/* Static membership: as set, or (null) only where pod names are stable, i.e. with a StatefulSet. Empty = off. */}}
{{- define "message-history.staticMembership" -}}
{{- $enabled := .Values.staticMembership.enabled }}
{{- if kindIs "invalid" $enabled }}{{ $enabled = eq .Values.workload.kind "StatefulSet" }}{{ end }}
{{- if $enabled }}true{{ end }}
{{- end }}

{{/* Graceful shutdown: always longer than the service's own drain grace. */}}
{{- define "message-history.terminationGracePeriodSeconds" -}}
{{- $grace := ceil .Values.config.shutdownGraceSeconds | int64 }}
{{- $margin := max 1 (int64 .Values.workload.terminationGraceMarginSeconds) }}
{{- add $grace $margin }}
{{- end }}

{{/* Replica count of one path's workload. Call with (dict "root" $ "path" $path). */}}
{{- define "message-history.replicas" -}}
{{- $root := .root }}
{{- $n := $root.Values.workload.replicas }}
{{- if ne .path "both" }}
{{- $own := (index $root.Values.split .path).replicas }}
{{- if not (kindIs "invalid" $own) }}{{ $n = $own }}{{ end }}
{{- end }}
{{- int64 $n }}
{{- end }}

{{/* Input topics of one path. Call with (dict "root" $ "path" $path); prints a space-separated list. */}}
{{- define "message-history.inputTopics" -}}
{{- $c := .root.Values.config }}
{{- if eq .path "recall" }}{{ $c.requestsTopic }}
{{- else if eq .path "persist" }}{{ $c.responsesTopic }}
{{- else }}{{ $c.requestsTopic }} {{ $c.responsesTopic }}
{{- end }}
{{- end }}

{{/* Settings ------------------------------------------------------------------------------------------------ */}}

{{/* values key under .Values.config -> environment variable the service reads (message_history/settings.py). */}}
{{- define "message-history.configEnvNames" -}}
requestsTopic: MESSAGE_HISTORY_REQUESTS_TOPIC
enrichedTopic: MESSAGE_HISTORY_ENRICHED_TOPIC
responsesTopic: MESSAGE_HISTORY_RESPONSES_TOPIC
persistedTopic: MESSAGE_HISTORY_PERSISTED_TOPIC
requestsDlqTopic: MESSAGE_HISTORY_REQUESTS_DLQ_TOPIC
responsesDlqTopic: MESSAGE_HISTORY_RESPONSES_DLQ_TOPIC
groupId: MESSAGE_HISTORY_GROUP_ID
sessionTimeoutMs: MESSAGE_HISTORY_SESSION_TIMEOUT_MS
maxPollIntervalMs: MESSAGE_HISTORY_MAX_POLL_INTERVAL_MS
lastMessages: MESSAGE_HISTORY_LAST_MESSAGES
maxRowsPerRequest: MESSAGE_HISTORY_MAX_ROWS_PER_REQUEST
barrier: MESSAGE_HISTORY_BARRIER
busyThread: MESSAGE_HISTORY_BUSY_THREAD
turnTimeoutMs: MESSAGE_HISTORY_TURN_TIMEOUT_MS
abandonTurnAfterMs: MESSAGE_HISTORY_ABANDON_TURN_AFTER_MS
maxTokens: MESSAGE_HISTORY_MAX_TOKENS
atMaxRemoveTokens: MESSAGE_HISTORY_AT_MAX_REMOVE_TOKENS
retainFullInput: MESSAGE_HISTORY_RETAIN_FULL_INPUT
rowCodec: MESSAGE_HISTORY_ROW_CODEC
maxBatchRecords: MESSAGE_HISTORY_MAX_BATCH_RECORDS
pollTimeoutMs: MESSAGE_HISTORY_POLL_TIMEOUT_MS
maxInFlightThreads: MESSAGE_HISTORY_MAX_IN_FLIGHT_THREADS
processingGuarantee: MESSAGE_HISTORY_PROCESSING_GUARANTEE
maxHeldOutputs: MESSAGE_HISTORY_MAX_HELD_OUTPUTS
commitIntervalMs: MESSAGE_HISTORY_COMMIT_INTERVAL_MS
lingerMs: MESSAGE_HISTORY_LINGER_MS
gcFreeze: MESSAGE_HISTORY_GC_FREEZE
gcThreshold: MESSAGE_HISTORY_GC_THRESHOLD
maxEventBytes: MESSAGE_HISTORY_MAX_EVENT_BYTES
maxMessagesPerEvent: MESSAGE_HISTORY_MAX_MESSAGES_PER_EVENT
maxPartsPerMessage: MESSAGE_HISTORY_MAX_PARTS_PER_MESSAGE
maxIdLength: MESSAGE_HISTORY_MAX_ID_LENGTH
retryInitialBackoffS: MESSAGE_HISTORY_RETRY_INITIAL_BACKOFF_S
retryMaxBackoffS: MESSAGE_HISTORY_RETRY_MAX_BACKOFF_S
mongodbTimeoutMs: MESSAGE_HISTORY_MONGODB_TIMEOUT_MS
storageTimeoutTries: MESSAGE_HISTORY_STORAGE_TIMEOUT_TRIES
kafkaUnreachableGraceMs: MESSAGE_HISTORY_KAFKA_UNREACHABLE_GRACE_MS
shutdownGraceSeconds: MESSAGE_HISTORY_SHUTDOWN_GRACE_S
httpHost: MESSAGE_HISTORY_HTTP_HOST
httpPort: MESSAGE_HISTORY_HTTP_PORT
logLevel: MESSAGE_HISTORY_LOG_LEVEL
pruneBatchSize: MESSAGE_HISTORY_PRUNE_BATCH_SIZE
forgetChunkSize: MESSAGE_HISTORY_FORGET_CHUNK_SIZE
pruneIntervalS: MESSAGE_HISTORY_PRUNE_INTERVAL_S
pruneOlderThan: MESSAGE_HISTORY_PRUNE_OLDER_THAN
commandsDlqTopic: MESSAGE_HISTORY_COMMANDS_DLQ_TOPIC
forgottenTopic: MESSAGE_HISTORY_FORGOTTEN_TOPIC
commandsTopic: MESSAGE_HISTORY_COMMANDS_TOPIC
observationalMemory: MESSAGE_HISTORY_OBSERVATIONAL_MEMORY
observationMessageTokens: MESSAGE_HISTORY_OBSERVATION_MESSAGE_TOKENS
reflectionObservationTokens: MESSAGE_HISTORY_REFLECTION_OBSERVATION_TOKENS
observationTimeoutS: MESSAGE_HISTORY_OBSERVATION_TIMEOUT_S
observeRequestsTopic: MESSAGE_HISTORY_OBSERVE_REQUESTS_TOPIC
observeResultsTopic: MESSAGE_HISTORY_OBSERVE_RESULTS_TOPIC
observeResultsDlqTopic: MESSAGE_HISTORY_OBSERVE_RESULTS_DLQ_TOPIC
outputCompression: MESSAGE_HISTORY_OUTPUT_COMPRESSION
{{- end }}

{{/* A value as the service expects it in the environment: strings verbatim, numbers without exponent. */}}
{{- define "message-history.envValue" -}}
{{- if kindIs "string" . }}{{ . | quote }}{{ else }}{{ . | toJson | quote }}{{ end }}
{{- end }}

{{/* Environment of every container running the service's code (workloads, replay Job, helm test). */}}
{{- define "message-history.env" -}}
- name: MONGODB_URI
  valueFrom:
    secretKeyRef:
      name: {{ include "message-history.mongodbUriSecretName" . }}
      key: {{ include "message-history.mongodbUriSecretKey" . }}
{{- $passwordSecret := include "message-history.kafkaPasswordSecretName" . }}
{{- if $passwordSecret }}
- name: MESSAGE_HISTORY_KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $passwordSecret }}
      key: {{ include "message-history.kafkaPasswordSecretKey" . }}
{{- end }}
{{- range $secret := list (dict "env" "MESSAGE_HISTORY_MESSAGE_ID_KEY" "ref" $.Values.messageIdKeys.keySecret "value" $.Values.secrets.messageIdKey "created" "message-id-key") (dict "env" "MESSAGE_HISTORY_MESSAGE_ID_PREVIOUS_KEYS" "ref" $.Values.messageIdKeys.previousKeysSecret "value" $.Values.secrets.messageIdPreviousKeys "created" "message-id-previous-keys") }}
{{- if $secret.ref.name }}
- name: {{ $secret.env }}
  valueFrom:
    secretKeyRef:
      name: {{ $secret.ref.name }}
      key: {{ $secret.ref.key }}
{{- else if and $.Values.secrets.create $secret.value }}
- name: {{ $secret.env }}
  valueFrom:
    secretKeyRef:
      name: {{ include "message-history.fullname" $ }}
      key: {{ $secret.created }}
{{- end }}
{{- end }}
{{- end }}

{{/* Volumes and mounts shared by every pod. */}}
{{- define "message-history.volumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.tmpSizeLimit }}
{{- with .Values.kafka.tls.caSecret.name }}
- name: kafka-ca
  secret:
    secretName: {{ . }}
    items:
      - key: {{ $.Values.kafka.tls.caSecret.key }}
        path: {{ $.Values.kafka.tls.caSecret.key }}
{{- end }}
{{- with .Values.mongodb.tls.caSecret.name }}
- name: mongodb-ca
  secret:
    secretName: {{ . }}
    items:
      - key: {{ $.Values.mongodb.tls.caSecret.key }}
        path: {{ $.Values.mongodb.tls.caSecret.key }}
{{- end }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "message-history.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if .Values.kafka.tls.caSecret.name }}
- name: kafka-ca
  mountPath: /etc/message-history/kafka-ca
  readOnly: true
{{- end }}
{{- if .Values.mongodb.tls.caSecret.name }}
- name: mongodb-ca
  mountPath: /etc/message-history/mongodb-ca
  readOnly: true
{{- end }}
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Pod-level settings shared by every pod. */}}
{{- define "message-history.podCommon" -}}
serviceAccountName: {{ include "message-history.serviceAccountName" . }}
automountServiceAccountToken: {{ .Values.serviceAccount.automountServiceAccountToken }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Refuse combinations that cannot work, with a message saying what to change. */}}
{{- define "message-history.validate" -}}
{{- if not (has .Values.paths (list "both" "split")) }}
{{- fail (printf "paths must be both or split, not %v" .Values.paths) }}
{{- end }}
{{- if not (has .Values.workload.kind (list "Deployment" "StatefulSet")) }}
{{- fail (printf "workload.kind must be Deployment or StatefulSet, not %v" .Values.workload.kind) }}
{{- end }}
{{- if and .Values.autoscaling.enabled .Values.keda.enabled }}
{{- fail "autoscaling.enabled and keda.enabled both create an HPA for the same workload: enable one" }}
{{- end }}
{{- if not (has .Values.kafka.securityProtocol (list "PLAINTEXT" "SSL" "SASL_PLAINTEXT" "SASL_SSL")) }}
{{- fail (printf "kafka.securityProtocol must be PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL, not %v" .Values.kafka.securityProtocol) }}
{{- end }}
{{- if and .Values.kafka.sasl.mechanism (not (hasPrefix "SASL_" .Values.kafka.securityProtocol)) }}
{{- fail "kafka.sasl.mechanism is set but kafka.securityProtocol is not SASL_PLAINTEXT or SASL_SSL" }}
{{- end }}
{{- if and .Values.secrets.create (not .Values.secrets.mongodbUri) (not .Values.mongodb.uriSecret.name) }}
{{- fail "secrets.create is true but secrets.mongodbUri is empty (or set mongodb.uriSecret.name)" }}
{{- end }}
{{- if le (float64 .Values.config.shutdownGraceSeconds) 0.0 }}
{{- fail "config.shutdownGraceSeconds must be above 0" }}
{{- end }}
{{- $partitions := int64 .Values.kafka.topicPartitions }}
{{- if gt $partitions 0 }}
{{- range $path := splitList " " (include "message-history.paths" $) }}
{{- $replicas := include "message-history.replicas" (dict "root" $ "path" $path) | int64 }}
{{- if gt $replicas $partitions }}
{{- fail (printf "workload %s has %d replicas but the input topics have %d partitions (kafka.topicPartitions): the extra pods would be idle" (include "message-history.workloadName" (dict "root" $ "path" $path)) $replicas $partitions) }}
{{- end }}
{{- end }}
{{- if and .Values.autoscaling.enabled (gt (int64 .Values.autoscaling.maxReplicas) $partitions) }}
{{- fail (printf "autoscaling.maxReplicas (%v) is above kafka.topicPartitions (%d)" .Values.autoscaling.maxReplicas $partitions) }}
{{- end }}
{{- if and .Values.keda.enabled (gt (int64 .Values.keda.maxReplicaCount) $partitions) }}
{{- fail (printf "keda.maxReplicaCount (%v) is above kafka.topicPartitions (%d)" .Values.keda.maxReplicaCount $partitions) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The ConfigMap's data: the service's settings as environment variables (also the topics Job's env). */}}
{{- define "message-history.configData" -}}
KAFKA_BOOTSTRAP_SERVERS: {{ required "kafka.bootstrapServers is required" .Values.kafka.bootstrapServers | quote }}
MONGODB_DATABASE: {{ .Values.mongodb.database | quote }}
MESSAGE_HISTORY_KAFKA_SECURITY_PROTOCOL: {{ .Values.kafka.securityProtocol | quote }}
{{- with .Values.kafka.sasl.mechanism }}
MESSAGE_HISTORY_KAFKA_SASL_MECHANISM: {{ . | quote }}
{{- end }}
{{- with .Values.kafka.sasl.username }}
MESSAGE_HISTORY_KAFKA_SASL_USERNAME: {{ . | quote }}
{{- end }}
{{- if .Values.kafka.tls.caSecret.name }}
MESSAGE_HISTORY_KAFKA_SSL_CAFILE: {{ printf "/etc/message-history/kafka-ca/%s" .Values.kafka.tls.caSecret.key | quote }}
{{- end }}
{{- $names := include "message-history.configEnvNames" . | fromYaml }}
{{- range $key := keys .Values.config | sortAlpha }}
{{- $value := index $.Values.config $key }}
{{- if not (hasKey $names $key) }}
{{- fail (printf "config.%s is not a setting of the service (known: %s)" $key (keys $names | sortAlpha | join ", ")) }}
{{- end }}
{{- if not (kindIs "invalid" $value) }}
{{ index $names $key }}: {{ include "message-history.envValue" $value }}
{{- end }}
{{- end }}
{{- end }}
