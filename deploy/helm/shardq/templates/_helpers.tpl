{{/* Names, labels and the values several templates share. */}}

{{- define "shardq.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The prefix of every object's name. Pod names (this, a dash and the
ordinal) are the node ids, and the headless Service's name is part of
each pod's DNS name: 40 characters leave room under the limits of both.
*/}}
{{- define "shardq.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "shardq.headless" -}}
{{ include "shardq.fullname" . }}-headless
{{- end }}

{{- define "shardq.etcd.fullname" -}}
{{ include "shardq.fullname" . }}-etcd
{{- end }}

{{- define "shardq.etcd.headless" -}}
{{ include "shardq.fullname" . }}-etcd-headless
{{- end }}

{{- define "shardq.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "shardq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ include "shardq.tag" . | trunc 63 | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The shardq pods; the etcd pods differ in component. */}}
{{- define "shardq.selectorLabels" -}}
app.kubernetes.io/name: {{ include "shardq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: broker
{{- end }}

{{- define "shardq.etcd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "shardq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: etcd
{{- end }}

{{- define "shardq.tag" -}}
{{ default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{- define "shardq.secret" -}}
{{ include "shardq.fullname" . }}
{{- end }}

{{/* The DNS domain of the pods of a headless Service in this namespace. */}}
{{- define "shardq.podDomain" -}}
{{ .service }}.{{ .root.Release.Namespace }}.svc.{{ .root.Values.clusterDomain }}
{{- end }}

{{/*
The etcd client URLs the nodes use, comma-separated: each member of the
chart's etcd by its pod's name, or etcd.endpoints. Empty: a single node.
*/}}
{{- define "shardq.etcdEndpoints" -}}
{{- if .Values.etcd.enabled }}
{{- $domain := include "shardq.podDomain" (dict "service" (include "shardq.etcd.headless" .) "root" .) }}
{{- $urls := list }}
{{- range $i := until (int .Values.etcd.replicaCount) }}
{{- $urls = append $urls (printf "http://%s-%d.%s:2379" (include "shardq.etcd.fullname" $) $i $domain) }}
{{- end }}
{{- join "," $urls }}
{{- else }}
{{- join "," .Values.etcd.endpoints }}
{{- end }}
{{- end }}

{{/*
A value kept across upgrades: the key of the chart's Secret as it is in
the cluster, or a new random one. Without a cluster (helm template) it
is new each time.
*/}}
{{- define "shardq.keep" -}}
{{- $old := lookup "v1" "Secret" .root.Release.Namespace (include "shardq.secret" .root) }}
{{- if and $old $old.data (hasKey $old.data .key) }}
{{- index $old.data .key | b64dec }}
{{- else }}
{{- randAlphaNum 40 }}
{{- end }}
{{- end }}

{{/* Checks of values the schema cannot express. */}}
{{- define "shardq.validate" -}}
{{- if and (not .Values.etcd.enabled) (not .Values.etcd.endpoints) (gt (int .Values.replicaCount) 1) }}
{{- fail "replicaCount > 1 needs etcd: set etcd.enabled=true, or etcd.endpoints to the client URLs of your etcd" }}
{{- end }}
{{- if and .Values.etcd.enabled .Values.etcd.endpoints }}
{{- fail "etcd.endpoints is for an etcd of yours: set etcd.enabled=false with it" }}
{{- end }}
{{- end }}

{{/*
The shardq config file: the config value with what the chart decides
merged over it, so that the listeners match the pod's ports, the data
directory its volume and the etcd endpoints the values.
*/}}
{{- define "shardq.config" -}}
{{- $p := .Values.ports }}
{{- $chart := dict "data_dir" "/data" }}
{{- $_ := set $chart "listen" (dict "mqtt" (printf ":%d" (int $p.mqtt)) "ws" (printf ":%d" (int $p.ws)) "http" (printf ":%d" (int $p.http))) }}
{{- $endpoints := include "shardq.etcdEndpoints" . }}
{{- if $endpoints }}
{{- $cluster := dict "addr" (printf ":%d" (int $p.cluster)) "etcd" (dict "endpoints" (splitList "," $endpoints)) }}
{{- if .Values.cluster.tlsSecret }}
{{- $_ := set $cluster "tls" (dict "cert" "/etc/shardq/cluster-tls/tls.crt" "key" "/etc/shardq/cluster-tls/tls.key" "ca" "/etc/shardq/cluster-tls/ca.crt") }}
{{- else }}
{{- /* The pod network, with the cluster token on every call. */}}
{{- $_ := set $cluster "allow_insecure" true }}
{{- end }}
{{- $_ := set $chart "cluster" $cluster }}
{{- end }}
{{- $cfg := mustMergeOverwrite (deepCopy (.Values.config | default dict)) $chart }}
{{- toYaml $cfg }}
{{- end }}
