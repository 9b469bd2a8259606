{{/*
Constants shared with stacks/eks_job.py: the container name the training operators look for,
the FSx mount, the probe files the trainer touches, and the trainer's progress line.
*/}}
{{- define "moe-training.container" -}}pytorch{{- end -}}
{{- define "moe-training.fsxMount" -}}/fsx{{- end -}}
{{- define "moe-training.profileMount" -}}/etc/moe-train{{- end -}}
{{- define "moe-training.profileFile" -}}train.yaml{{- end -}}
{{- define "moe-training.livenessFile" -}}/tmp/moe-train/alive{{- end -}}
{{- define "moe-training.readinessFile" -}}/tmp/moe-train/ready{{- end -}}
{{- define "moe-training.progressLogPattern" -}}{{ `.*step \d+/\d+ loss .*` }}{{- end -}}

{{/* The training image; rendering fails without it. */}}
{{- define "moe-training.image" -}}
{{- required "image is required: set image to the training image URI, e.g. --set image=<account>.dkr.ecr.<region>.amazonaws.com/<repository>:<tag>" .Values.image -}}
{{- end -}}

{{/* The ConfigMap of the training profile: <name>-profile, cut to a Kubernetes name. */}}
{{- define "moe-training.profileConfigMap" -}}
{{- regexReplaceAll "-+$" (printf "%s-profile" .Values.name | trunc 63) "" -}}
{{- end -}}

{{/* Labels of the job and its pods. */}}
{{- define "moe-training.labels" -}}
app.kubernetes.io/name: moe-training
app.kubernetes.io/instance: {{ .Values.name | toJson }}
app.kubernetes.io/managed-by: moe-cdk
{{- end -}}

{{/* The trainer's arguments: the fixed ones (probe files included), then trainArgs. */}}
{{- define "moe-training.args" -}}
{{- $v := .Values -}}
{{- $args := list "--config" (printf "%s/%s" (include "moe-training.profileMount" .) (include "moe-training.profileFile" .))
    "--set" (printf "metrics.readiness_file=%s" (include "moe-training.readinessFile" .))
    "--set" (printf "metrics.liveness_file=%s" (include "moe-training.livenessFile" .)) -}}
{{- range $v.trainArgs }}{{ $args = append $args (toString .) }}{{ end -}}
{{- toYaml $args -}}
{{- end -}}

{{/*
The pod template, one pod per node. Takes a dict: root (the chart's context), command (a
list) and extraPorts (container ports before the metrics port).
*/}}
{{- define "moe-training.podTemplate" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $resources := dict $v.deviceResource (int $v.devicesPerNode) -}}
{{- if gt (int $v.efaPerNode) 0 }}{{ $_ := set $resources "vpc.amazonaws.com/efa" (int $v.efaPerNode) }}{{ end -}}
{{- $metrics := not (kindIs "invalid" $v.metricsPort) -}}
{{- $ports := .extraPorts -}}
{{- if $metrics }}{{ $ports = append $ports (dict "name" "metrics" "containerPort" (int $v.metricsPort)) }}{{ end -}}
{{- $nodeSelector := merge (deepCopy (default (dict) $v.nodeLabels)) (dict "node.kubernetes.io/instance-type" $v.instanceType) -}}
{{- $alive := include "moe-training.livenessFile" $root -}}
metadata:
  labels:
    {{- include "moe-training.labels" $root | nindent 4 }}
  {{- if $metrics }}
  annotations:
    prometheus.io/scrape: "true"
    prometheus.io/port: {{ int $v.metricsPort | toString | toJson }}
  {{- end }}
spec:
  {{- /* hostNetwork: the node's network namespace; EFA works on the pod's own too (jobs/eks_job.py, POD_NETWORK). */}}
  {{- if $v.hostNetwork }}
  hostNetwork: true
  dnsPolicy: ClusterFirstWithHostNet
  {{- end }}
  {{- /* Root without capabilities under the runtime's seccomp profile (jobs/eks_job.py, POD_SECURITY_CONTEXT). */}}
  securityContext:
    seccompProfile:
      type: RuntimeDefault
  nodeSelector:
    {{- toYaml $nodeSelector | nindent 4 }}
  terminationGracePeriodSeconds: {{ int $v.terminationGraceSeconds }}
  containers:
    - name: {{ include "moe-training.container" $root }}
      image: {{ include "moe-training.image" $root | toJson }}
      imagePullPolicy: IfNotPresent
      command:
        {{- toYaml .command | nindent 8 }}
      args:
        {{- include "moe-training.args" $root | nindent 8 }}
      resources:
        requests:
          {{- toYaml $resources | nindent 10 }}
        limits:
          {{- toYaml $resources | nindent 10 }}
      securityContext:
        allowPrivilegeEscalation: false
        capabilities:
          drop: ["ALL"]
      volumeMounts:
        - name: fsx
          mountPath: {{ include "moe-training.fsxMount" $root }}
        - name: shm
          mountPath: /dev/shm
        - name: profile
          mountPath: {{ include "moe-training.profileMount" $root }}
          readOnly: true
      startupProbe:
        exec:
          command: ["test", "-f", {{ $alive | toJson }}]
        periodSeconds: 30
        failureThreshold: {{ div (add (int $v.startupTimeoutSeconds) 29) 30 }}
      readinessProbe:
        exec:
          command: ["test", "-f", {{ include "moe-training.readinessFile" $root | toJson }}]
        periodSeconds: 30
      livenessProbe:
        exec:
          command:
            - sh
            - -c
            - {{ printf "test $(( $(date +%%s) - $(stat -c %%Y %s) )) -lt %d" $alive (int $v.stallTimeoutSeconds) | toJson }}
        periodSeconds: 30
        failureThreshold: 2
      {{- with $ports }}
      ports:
        {{- toYaml . | nindent 8 }}
      {{- end }}
  volumes:
    - name: fsx
      persistentVolumeClaim:
        claimName: {{ $v.claimName | toJson }}
    - name: shm
      emptyDir:
        medium: Memory
        sizeLimit: {{ printf "%dGi" (int $v.shmSizeGiB) | toJson }}
    - name: profile
      configMap:
        name: {{ include "moe-training.profileConfigMap" $root | toJson }}
  {{- with $v.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
