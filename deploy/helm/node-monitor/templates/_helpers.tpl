{{/* Labels Helm adds to every object of the release (the objects' own labels stay). */}}
{{- define "node-monitor.releaseLabels" -}}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: node-monitor
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* The agent's image reference. */}}
{{- define "node-monitor.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ $tag }}
{{- end -}}
{{- end }}

{{/*
The objects of one file shipped in deploy/ (linked under files/), so that the chart and the
Kustomize manifests are the same objects: the namespace `node-monitor` becomes the release's
(also in service-account user names), the shipped image references become .Values.image and .Values.remediate.image, the
release's labels are added, and a CRD is kept on uninstall (deleting it would delete every
object of its kind). Arguments: ctx (the root context), path, and optionally extraLabels.
*/}}
{{- define "node-monitor.fromFile" -}}
{{- $ctx := .ctx -}}
{{- $text := $ctx.Files.Get .path -}}
{{- if not $text -}}
{{- fail (printf "chart file %s is missing or empty (a broken link to deploy/?)" .path) -}}
{{- end -}}
{{- $ns := $ctx.Release.Namespace -}}
{{- $text = regexReplaceAll "(?m)^(\\s*namespace:) node-monitor\\s*$" $text (printf "${1} %s" $ns) -}}
{{- $text = replace "system:serviceaccount:node-monitor:" (printf "system:serviceaccount:%s:" $ns) $text -}}
{{- $text = replace "ghcr.io/node-monitor/node-monitor:0.1.0" (include "node-monitor.image" $ctx) $text -}}
{{- $text = replace "ghcr.io/node-monitor/node-monitor-remediate:0.1.0" $ctx.Values.remediate.image $text -}}
{{- $labels := include "node-monitor.releaseLabels" $ctx | fromYaml -}}
{{- $extra := .extraLabels | default dict -}}
{{- range $doc := regexSplit "(?m)^---\\s*$" $text -1 }}
{{- $obj := fromYaml $doc }}
{{- if hasKey $obj "Error" }}
{{- fail (printf "%s: %s" $.path (get $obj "Error")) }}
{{- end }}
{{- if $obj }}
{{- $meta := $obj.metadata }}
{{- $_ := set $meta "labels" (merge (deepCopy $extra) (default dict $meta.labels) (deepCopy $labels)) }}
{{- if eq $obj.kind "CustomResourceDefinition" }}
{{- $_ := set $meta "annotations" (merge (default dict $meta.annotations) (dict "helm.sh/resource-policy" "keep")) }}
{{- end }}
---
{{ toYaml $obj }}
{{- end }}
{{- end }}
{{- end }}

{{/* The kubepods cgroup flag for .Values.kubepodsCgroup, else .Values.cgroupDriver. */}}
{{- define "node-monitor.kubepodsCgroup" -}}
{{- $d := .Values.cgroupDriver -}}
{{- if .Values.kubepodsCgroup }}{{ .Values.kubepodsCgroup }}{{ else if eq $d "systemd" }}kubepods.slice{{ else if eq $d "cgroupfs" }}kubepods{{ else }}auto{{ end -}}
{{- end }}

{{/* The container runtime's state directory: hostPaths.runtimeState, else by .Values.runtime
and .Values.distribution (k3s and RKE2 embed containerd under /var/lib/rancher). */}}
{{- define "node-monitor.runtimeState" -}}
{{- $d := .Values.distribution -}}
{{- if .Values.hostPaths.runtimeState }}{{ .Values.hostPaths.runtimeState }}
{{- else if eq .Values.runtime "crio" }}/var/lib/containers
{{- else if eq $d "k3s" }}/var/lib/rancher/k3s/agent/containerd
{{- else if eq $d "rke2" }}/var/lib/rancher/rke2/agent/containerd
{{- else }}/var/lib/containerd{{ end -}}
{{- end }}

{{/* The kubelet configuration mounted beyond the kubelet root, as a YAML list of {path, type}:
the distribution's, then hostPaths.kubeletConfig. */}}
{{- define "node-monitor.kubeletConfigMounts" -}}
{{- $d := .Values.distribution -}}
{{- $m := list -}}
{{- if eq $d "k3s" }}{{ $m = append $m (dict "path" "/var/lib/rancher/k3s/agent/etc/kubelet.conf.d" "type" "DirectoryOrCreate") }}{{ end -}}
{{- if eq $d "rke2" }}{{ $m = append $m (dict "path" "/var/lib/rancher/rke2/agent/etc/kubelet.conf.d" "type" "DirectoryOrCreate") }}{{ end -}}
{{- if eq $d "eks" }}{{ $m = append $m (dict "path" "/etc/kubernetes/kubelet" "type" "DirectoryOrCreate") }}{{ end -}}
{{- if eq $d "gke" }}{{ $m = append $m (dict "path" "/home/kubernetes/kubelet-config.yaml" "type" "File") }}{{ end -}}
{{- range .Values.hostPaths.kubeletConfig }}{{ $m = append $m (dict "path" .path "type" (.type | default "DirectoryOrCreate")) }}{{ end -}}
{{- toYaml (dict "mounts" $m) -}}
{{- end }}
