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

{{/* `<repository>@<digest>` when a digest is pinned, else `<repository>:<tag>`, the tag
defaulting to the chart's appVersion. */}}
{{- define "exitorder.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
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

{{/* The kubelet's root directory on the host: kubeletRootDir, else the runtime's own. */}}
{{- define "exitorder.kubeletRootDir" -}}
{{- if .Values.kubeletRootDir }}
{{- trimSuffix "/" .Values.kubeletRootDir }}
{{- else if eq .Values.runtime "microk8s" }}
{{- "/var/snap/microk8s/common/var/lib/kubelet" }}
{{- else }}
{{- "/var/lib/kubelet" }}
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

{{/* The webhook's --addr: address and port (an IPv6 address in brackets). */}}
{{- define "exitorder.webhookAddr" -}}
{{- if contains ":" .Values.webhook.address }}
{{- printf "[%s]:%d" .Values.webhook.address (int .Values.webhook.port) }}
{{- else }}
{{- printf "%s:%d" .Values.webhook.address (int .Values.webhook.port) }}
{{- end }}
{{- end }}

{{/*
The admission webhook's objects (rendered when webhook.enabled is true).
*/}}

{{/*
Name of the webhook's Deployment, Service and serving Certificate: `<fullname>-webhook`, the
full name cut so that the suffix always fits in 63 characters.
*/}}
{{- define "exitorder.webhook.fullname" -}}
{{- printf "%s-webhook" (include "exitorder.fullname" . | trunc 55 | trimSuffix "-") }}
{{- end }}

{{/* The Secret holding the webhook's serving certificate and key (and its CA, ca.crt). */}}
{{- define "exitorder.webhook.tlsSecret" -}}
{{- printf "%s-tls" (include "exitorder.webhook.fullname" .) }}
{{- end }}

{{/*
Labels that select the webhook's pods (immutable once the Deployment exists). They differ from
the agent's in app.kubernetes.io/component, so neither the DaemonSet nor the PodMonitor
selects a webhook pod.
*/}}
{{- define "exitorder.webhook.selectorLabels" -}}
app.kubernetes.io/name: {{ include "exitorder.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: webhook
{{- end }}

{{/* Labels on the webhook's objects and pods: the chart's labels, component webhook. */}}
{{- define "exitorder.webhook.labels" -}}
{{- $selector := include "exitorder.webhook.selectorLabels" . | fromYaml }}
{{- $all := include "exitorder.labels" . | fromYaml }}
{{- merge $selector $all | toYaml }}
{{- end }}

{{/*
The DNS names the API server may use for the webhook's Service; the serving certificate names
them all. The API server calls `<svc>.<ns>.svc`.
*/}}
{{- define "exitorder.webhook.dnsNames" -}}
{{- $svc := include "exitorder.webhook.fullname" . }}
{{- $ns := .Release.Namespace }}
{{- list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) | toYaml }}
{{- end }}

{{/*
Whether the share's guard is rendered: as webhook.shareGuard.enabled says, or, left unset, only
where the injection uses the host share (webhook.handshakeVolume: hostPath). Pod-local
injection puts nothing in the share for a pod to reach.
*/}}
{{- define "exitorder.webhook.shareGuard" -}}
{{- $on := .Values.webhook.shareGuard.enabled -}}
{{- if kindIs "invalid" $on -}}
{{- $on = eq .Values.webhook.handshakeVolume "hostPath" -}}
{{- end -}}
{{- if $on }}true{{ end -}}
{{- end }}

{{/*
The guard's matchConditions expression: the pods a container of which mounts, writable, a
hostPath volume that may reach the share or the bin directory: one of their ancestors or
themselves, anything below them, or a path spelled in a way a prefix cannot judge (`//`,
`.` or `..` components, relative). Every other pod (node-exporter's read-only `/`, a log
shipper's `/var/log`) is never sent, so it never depends on the webhook. What is sent, the
webhook judges exactly (after resolving the path's spelling).
*/}}
{{- define "exitorder.webhook.shareGuardCondition" -}}
{{- $p := "v.hostPath.path" -}}
{{- $reach := list (printf "%s.contains('//') || %s.contains('/.') || !%s.startsWith('/')" $p $p $p) -}}
{{- range $dir := list .Values.shareDir .Values.binDir -}}
{{- $d := squote (printf "%s/" (trimSuffix "/" $dir)) -}}
{{- $reach = append $reach (printf "%s.startsWith(%s.endsWith('/') ? %s : %s + '/')" $d $p $p $p) -}}
{{- $reach = append $reach (printf "%s.startsWith(%s)" $p $d) -}}
{{- end -}}
{{- $writable := "[object.spec.containers, has(object.spec.initContainers) ? object.spec.initContainers : [], has(object.spec.ephemeralContainers) ? object.spec.ephemeralContainers : []].exists(cs, cs.exists(c, has(c.volumeMounts) && c.volumeMounts.exists(m, m.name == v.name && !(has(m.readOnly) && m.readOnly))))" -}}
{{- printf "has(object.spec.volumes) && object.spec.volumes.exists(v, has(v.hostPath) && (%s) && %s)" (join " || " $reach) $writable -}}
{{- end }}
