{{/* Names and labels, as `helm create` makes them. */}}
{{- define "tierproxy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tierproxy.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "tierproxy.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "tierproxy.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "tierproxy.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "tierproxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels of one component: pass (dict "root" $ "component" "proxy"). */}}
{{- define "tierproxy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tierproxy.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "tierproxy.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tierproxy.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* An image reference: pass (dict "root" $ "image" .Values.image); the tag defaults to appVersion. */}}
{{- define "tierproxy.image" -}}
{{- printf "%s:%s" .image.repository (.image.tag | default .root.Chart.AppVersion) }}
{{- end }}

{{/* Whole CPUs of a Kubernetes quantity, rounded up, at least 1: "500m" -> 1, "2" -> 2, "2.5" -> 3. */}}
{{- define "tierproxy.cpus" -}}
{{- $cpu := toString . }}
{{- if hasSuffix "m" $cpu }}
{{- max 1 (div (add (trimSuffix "m" $cpu | int) 999) 1000) }}
{{- else }}
{{- max 1 (ceil (float64 $cpu) | int) }}
{{- end }}
{{- end }}

{{/* A value of `config` as the properties file writes it: whole numbers without an exponent. */}}
{{- define "tierproxy.propertyValue" -}}
{{- if and (kindIs "float64" .) (eq . (floor .)) }}{{ int64 . }}
{{- else if kindIs "bool" . }}{{ ternary "true" "false" . }}
{{- else }}{{ toString . | replace "\\" "\\\\" | replace "\n" "\\n" }}
{{- end }}
{{- end }}

{{/*
The effective configuration: `config` with what the chart sets when a key is not given.
Rendered as JSON (a dict of strings); every template reads ports and paths from it, so the
objects and the file cannot disagree.
*/}}
{{- define "tierproxy.config" -}}
{{- $c := dict }}
{{- range $key, $value := .Values.config }}
{{- $_ := set $c $key (include "tierproxy.propertyValue" $value) }}
{{- end }}
{{- $defaults := dict
  "proxy.listener.host" "0.0.0.0"
  "proxy.advertised.host" (printf "%s.%s.svc" (include "tierproxy.fullname" .) .Release.Namespace)
  "proxy.bootstrap.port" "9192"
  "proxy.broker.port.base" "9193"
  "metrics.port" "9404"
  "pipeline.metrics.port" "9405"
  "proxy.workers" (include "tierproxy.cpus" (.Values.proxy.resources.requests.cpu | default "1"))
  "spark.master" (printf "local[%s]" (include "tierproxy.cpus" (.Values.pipeline.resources.requests.cpu | default "1")))
  "remote.log.metadata.dir" "/var/lib/tierproxy/metadata"
  "remote.log.index.cache.dir" "/var/lib/tierproxy/index-cache" }}
{{- range $key, $value := $defaults }}
{{- if not (hasKey $c $key) }}
{{- $_ := set $c $key $value }}
{{- end }}
{{- end }}
{{- toJson $c }}
{{- end }}

{{/*
The broker listeners as a JSON list of {"node", "port"}, the way tierproxy assigns them
(config/broker_ports.py): proxy.broker.port.map, else proxy.broker.node.id.range from
proxy.broker.port.start, else proxy.broker.port.base + each of proxy.brokerNodeIds.
*/}}
{{- define "tierproxy.brokerPorts" -}}
{{- $c := include "tierproxy.config" . | fromJson }}
{{- $ports := list }}
{{- $map := get $c "proxy.broker.port.map" }}
{{- $range := get $c "proxy.broker.node.id.range" }}
{{- if $map }}
{{- range splitList "," $map }}
{{- $pair := splitList ":" (trim .) }}
{{- $ports = append $ports (dict "node" (index $pair 0 | int) "port" (index $pair 1 | int)) }}
{{- end }}
{{- else if $range }}
{{- $bounds := splitList "-" (trim $range) }}
{{- $low := index $bounds 0 | int }}
{{- $start := required "config: proxy.broker.node.id.range needs proxy.broker.port.start" (get $c "proxy.broker.port.start") | int }}
{{- range $i := until (add 1 (sub (index $bounds 1 | int) $low) | int) }}
{{- $ports = append $ports (dict "node" (add $low $i) "port" (add $start $i)) }}
{{- end }}
{{- else }}
{{- $base := get $c "proxy.broker.port.base" | int }}
{{- range .Values.proxy.brokerNodeIds }}
{{- $ports = append $ports (dict "node" (int .) "port" (add $base (int .))) }}
{{- end }}
{{- end }}
{{- toJson $ports }}
{{- end }}

{{/* Where the init container writes the file the commands read. */}}
{{- define "tierproxy.configFile" -}}/run/tierproxy/tierproxy.properties{{- end }}

{{/*
The pod's security: the image's non-root user (uid 10001, the Dockerfile's), nothing writable
but the volumes below, no capabilities.
*/}}
{{- define "tierproxy.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "tierproxy.securityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end }}

{{/*
The init container: the rendered file from the ConfigMap, then each of secretProperties read
from its mounted Secret, written (Java properties escaping) into a memory-backed volume.
Trailing newlines of a Secret's value are dropped. Pass (dict "root" $ "image" "...").
*/}}
{{- define "tierproxy.initConfig" -}}
- name: config
  image: {{ .image }}
  command:
    - python
    - -c
    - |
      import pathlib, sys, javaproperties
      src, secrets, out = map(pathlib.Path, sys.argv[1:])
      values = {f.name: f.read_text().rstrip("\n") for f in sorted(secrets.iterdir())
                if not f.name.startswith(".") and f.is_file()}
      out.write_text(src.read_text() + javaproperties.dumps(values, timestamp=False))
    - /etc/tierproxy/config/tierproxy.properties
    - /etc/tierproxy/secret-properties
    - {{ include "tierproxy.configFile" .root }}
  securityContext:
    {{- include "tierproxy.securityContext" .root | nindent 4 }}
  volumeMounts:
    {{- include "tierproxy.configMounts" .root | nindent 4 }}
{{- end }}

{{- define "tierproxy.configMounts" -}}
- name: config
  mountPath: /etc/tierproxy/config
  readOnly: true
- name: secret-properties
  mountPath: /etc/tierproxy/secret-properties
  readOnly: true
- name: run
  mountPath: /run/tierproxy
{{- end }}

{{/* What both containers mount: the run volume with the file, the Secrets, the data dir. */}}
{{- define "tierproxy.mounts" -}}
- name: run
  mountPath: /run/tierproxy
  readOnly: true
- name: data
  mountPath: /var/lib/tierproxy
- name: tmp
  mountPath: /tmp
{{- range $i, $m := .Values.secretMounts }}
- name: secret-{{ $i }}
  mountPath: {{ $m.mountPath }}
  readOnly: true
{{- end }}
{{- end }}

{{/* The volumes of a pod: pass (dict "root" $ "sizeLimit" "1Gi"). */}}
{{- define "tierproxy.volumes" -}}
- name: config
  configMap:
    name: {{ include "tierproxy.fullname" .root }}
- name: secret-properties
{{- if .root.Values.secretProperties }}
  projected:
    sources:
      {{- range .root.Values.secretProperties }}
      - secret:
          name: {{ .secretName }}
          items:
            - key: {{ .key }}
              path: {{ .property }}
      {{- end }}
{{- else }}
  emptyDir: {}
{{- end }}
- name: run
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
- name: data
  emptyDir:
    sizeLimit: {{ .sizeLimit }}
- name: tmp
  emptyDir:
    sizeLimit: {{ .sizeLimit }}
{{- range $i, $m := .root.Values.secretMounts }}
- name: secret-{{ $i }}
  secret:
    secretName: {{ $m.secretName }}
    defaultMode: 0440
{{- end }}
{{- end }}

{{/* S3 credentials from their Secret, for the AWS credential chain. */}}
{{- define "tierproxy.env" -}}
{{- with .Values.s3Credentials }}
{{- if .secretName }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ .secretName }}
      key: {{ .accessKeyIdKey }}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .secretName }}
      key: {{ .secretAccessKeyKey }}
{{- end }}
{{- end }}
{{- end }}
