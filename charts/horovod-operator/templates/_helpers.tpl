{{/* Chart name, truncated to a DNS label. */}}
{{- define "horovod-operator.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: the release name alone when it already holds the chart name. */}}
{{- define "horovod-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "horovod-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "horovod-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "horovod-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "horovod-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "horovod-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "horovod-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "horovod-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
The rules the operator needs, and nothing more. Shared by the ClusterRole
(all namespaces) and the per-namespace Roles; tests/operator/integration/test_chart.py
checks with `kubectl auth can-i` that nothing beyond them is granted.
*/}}
{{- define "horovod-operator.rules" -}}
# Watched; read again after a status conflict; deleted when its TTL passes.
- apiGroups: ["horovod.ai"]
  resources: ["horovodjobs"]
  verbs: ["get", "list", "watch", "delete"]
- apiGroups: ["horovod.ai"]
  resources: ["horovodjobs/status"]
  verbs: ["patch"]
# Children set blockOwnerDeletion, which the OwnerReferencesPermissionEnforcement
# admission plugin allows only to who may update the owner's finalizers.
- apiGroups: ["horovod.ai"]
  resources: ["horovodjobs/finalizers"]
  verbs: ["update"]
# deletecollection: a finished or restarting job's workers go in one request.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete", "deletecollection"]
{{- if .Values.metrics.firstStep.enabled }}
# The start of rank 0's log, until its first-step line: time to first step.
- apiGroups: [""]
  resources: ["pods/log"]
  verbs: ["get"]
{{- end }}
# The job's ConfigMap and Service are watched (label-selected) so that one
# deleted by hand is recreated, and a name held by another owner is seen.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "delete"]
# The job's SSH Secret is read by name, never listed or watched: that would
# take every Secret of the cluster (or namespace) into the operator.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create", "delete"]
# The hostfile is rewritten when a restart or resume changes replicas or slots.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "delete"]
# Events: posted on jobs; listed for a pod slow to start (FailedMount is only there).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "list"]
# Native gang scheduling: a PodGroup per attempt, created before its workers
# (get: a 409 is checked to be the job's own); deletecollection: it replaces the
# earlier attempts' groups in one request. Garbage collection deletes the last.
- apiGroups: ["scheduling.k8s.io"]
  resources: ["podgroups"]
  verbs: ["get", "create", "deletecollection"]
# The same for Volcano's and scheduler-plugins' coscheduling PodGroups
# (gang.policy Volcano | Coscheduling; docs/scheduling.md).
- apiGroups: ["scheduling.volcano.sh", "scheduling.x-k8s.io"]
  resources: ["podgroups"]
  verbs: ["get", "create", "deletecollection"]
# Kueue (docs/kueue.md): a job with a queue is admitted as one Workload, watched
# (label-selected) for its admission; its status is written as Kueue's job
# framework writes it (admission cleared after an eviction, Finished at the end).
# patch: on a MultiKueue worker cluster, the Workload MultiKueue made is adopted.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads/status"]
  verbs: ["patch"]
# DRA (docs/dra.md): the ResourceClaimTemplates a worker template names are read
# by name to count the GPUs per worker; never listed, never written.
- apiGroups: ["resource.k8s.io"]
  resources: ["resourceclaimtemplates"]
  verbs: ["get"]
{{- end }}
