{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "pio.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-qualified name for the operator's objects. */}}
{{- define "pio.fullname" -}}
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

{{- define "pio.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pio.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "pio.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "pio.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: paged-inference
{{- end }}

{{- define "pio.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "pio.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The operator's permissions: only the verbs on the resources it uses, no wildcards.
kopf watches and patches PagedInferenceServices and posts Events; it watches the engine
pods (to report an engine that cannot start). The reconciler reads, creates and patches
the children, and deletes only optional ones it no longer wants (model-cache claim,
autoscalers, PodMonitor, NetworkPolicy, the router's objects, a finished tuning's
load-worker Deployments and Services). It may read EndpointSlices
because it grants exactly that to the router's Role (RBAC forbids granting more than one
holds).
*/}}
{{- define "pio.rules" -}}
- apiGroups: [serving.pagedinference.dev]
  resources: [pagedinferenceservices]
  verbs: [get, list, watch, patch, create, delete]
- apiGroups: [serving.pagedinference.dev]
  resources: [pagedinferenceservices/status]
  verbs: [get, patch]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [apps]
  resources: [deployments/scale]
  verbs: [get, patch, update]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, create, patch]
- apiGroups: [""]
  resources: [services, serviceaccounts, persistentvolumeclaims]
  verbs: [get, create, patch, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, create, patch]
- apiGroups: [autoscaling]
  resources: [horizontalpodautoscalers]
  verbs: [get, create, patch, delete]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, create, patch, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, create, patch, delete]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
- apiGroups: [keda.sh]
  resources: [scaledobjects]
  verbs: [get, create, patch, delete]
- apiGroups: [monitoring.coreos.com]
  resources: [podmonitors]
  verbs: [get, create, patch, delete]
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]   # patch: the SLO planner's Role folds its repeated Events
{{- if gt (int .Values.replicaCount) 1 }}
- apiGroups: [kopf.dev]
  resources: [{{ if .Values.clusterWide }}clusterkopfpeerings{{ else }}kopfpeerings{{ end }}]
  verbs: [get, list, watch, patch]
{{- end }}
{{ include "pio.tuningRules" . }}
{{- end }}

{{/*
The namespaces watched, comma-separated; empty when cluster-wide. Default: the release's own.
*/}}
{{- define "pio.watchNamespaces" -}}
{{- if and .Values.clusterWide .Values.watchNamespaces }}
{{- fail "set either clusterWide: true or watchNamespaces, not both" }}
{{- end }}
{{- if not .Values.clusterWide }}
{{- join "," (.Values.watchNamespaces | default (list .Release.Namespace)) }}
{{- end }}
{{- end }}
