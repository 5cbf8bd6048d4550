{{/*
The pipeline's pod spec, shared by its Deployment (`tier --every`) and its CronJob (one
`tier` pass): pass (dict "root" $ "args" (list ...)).
*/}}
{{- define "tierproxy.pipelinePodSpec" -}}
{{- $root := .root }}
{{- $c := include "tierproxy.config" $root | fromJson }}
{{- $image := include "tierproxy.image" (dict "root" $root "image" $root.Values.pipelineImage) }}
serviceAccountName: {{ include "tierproxy.serviceAccountName" $root }}
automountServiceAccountToken: false
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
# SIGTERM ends `tier --every` after the current pass.
terminationGracePeriodSeconds: {{ $root.Values.pipeline.terminationGracePeriodSeconds }}
securityContext:
  {{- include "tierproxy.podSecurityContext" $root | nindent 2 }}
initContainers:
  {{- include "tierproxy.initConfig" (dict "root" $root "image" $image) | nindent 2 }}
containers:
  - name: pipeline
    image: {{ $image }}
    imagePullPolicy: {{ $root.Values.pipelineImage.pullPolicy }}
    command: ["tierproxy", "tier", "--config", {{ include "tierproxy.configFile" $root | quote }}{{ range .args }}, {{ . | quote }}{{ end }}]
    {{- if .metrics }}
    ports:
      - name: metrics
        containerPort: {{ get $c "pipeline.metrics.port" }}
        protocol: TCP
    {{- end }}
    env:
      # Spark's Python workers run the driver's interpreter; its JVM writes under /tmp.
      - name: PYSPARK_PYTHON
        value: python3
      - name: HOME
        value: /var/lib/tierproxy
      {{- with include "tierproxy.env" $root | trim }}
      {{- . | nindent 6 }}
      {{- end }}
    resources:
      {{- toYaml $root.Values.pipeline.resources | nindent 6 }}
    securityContext:
      {{- include "tierproxy.securityContext" $root | nindent 6 }}
    volumeMounts:
      {{- include "tierproxy.mounts" $root | nindent 6 }}
volumes:
  {{- include "tierproxy.volumes" (dict "root" $root "sizeLimit" $root.Values.pipeline.dataVolumeSizeLimit) | nindent 2 }}
{{- with $root.Values.pipeline.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.pipeline.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.pipeline.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
