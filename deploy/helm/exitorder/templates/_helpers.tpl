{{/*
Names and labels shared by the chart's objects.
*/}}

{{/* The chart's name, or nameOverride. */}}
{{- define "exitorder.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name of the release's objects: fullnameOverride, else the release name when it already
holds the chart name (`exitorder`), else `<release>-<chart>`. At most 63 characters.
*/}}
{{- define "exitorder.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := include "exitorder.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* `<chart>-<version>` for the helm.sh/chart label. */}}
{{- define "exitorder.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that select the agent's pods (immutable once the DaemonSet exists). */}}
{{- define "exitorder.selectorLabels" -}}
app.kubernetes.io/name: {{ include "exitorder.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: agent
{{- end }}

{{/*
Labels on every object: commonLabels, then the chart's own; the selector labels always win.
*/}}
{{- define "exitorder.labels" -}}
{{- $own := dict
      "app.kubernetes.io/version" .Chart.AppVersion
      "app.kubernetes.io/part-of" "exitorder"
      "app.kubernetes.io/managed-by" .Release.Service
      "helm.sh/chart" (include "exitorder.chart" .) }}
{{- $selector := include "exitorder.selectorLabels" . | fromYaml }}
{{- merge $selector (deepCopy (default (dict) .Values.commonLabels)) $own | toYaml }}
{{- end }}

{{/* Labels of the agent's pods: the labels above with podLabels (never over the selector's). */}}
{{- define "exitorder.podLabels" -}}
{{- $selector := include "exitorder.selectorLabels" . | fromYaml }}
{{- $all := include "exitorder.labels" . | fromYaml }}
{{- merge $selector (deepCopy (default (dict) .Values.podLabels)) $all | toYaml }}
{{- end }}

{{/* The agent's ServiceAccount. */}}
{{- define "exitorder.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "exitorder.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name must name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* `<repository>:<tag>`, the tag defaulting to the chart's appVersion. */}}
{{- define "exitorder.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The CRI socket on the host: criSocket (without unix://), else the runtime's own path. */}}
{{- define "exitorder.criSocket" -}}
{{- $paths := dict
      "containerd" "/run/containerd/containerd.sock"
      "crio" "/var/run/crio/crio.sock"
      "k3s" "/run/k3s/containerd/containerd.sock"
      "rke2" "/run/k3s/containerd/containerd.sock"
      "microk8s" "/var/snap/microk8s/common/run/containerd.sock" }}
{{- if .Values.criSocket }}
{{- trimPrefix "unix://" .Values.criSocket }}
{{- else }}
{{- required (printf "runtime %q has no known CRI socket; set criSocket" .Values.runtime) (get $paths .Values.runtime) }}
{{- end }}
{{- end }}

{{/* Where the socket's directory is mounted in the agent container. */}}
{{- define "exitorder.criSocketMount" -}}
/run/exitorder-cri
{{- end }}

{{/* EXITORDER_METRICS_ADDR: address and port (an IPv6 address in brackets). */}}
{{- define "exitorder.metricsAddr" -}}
{{- if contains ":" .Values.metrics.address }}
{{- printf "[%s]:%d" .Values.metrics.address (int .Values.metrics.port) }}
{{- else }}
{{- printf "%s:%d" .Values.metrics.address (int .Values.metrics.port) }}
{{- end }}
{{- end }}
