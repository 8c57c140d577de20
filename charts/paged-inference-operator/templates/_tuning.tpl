{{/*
The operator's rules for PagedInferenceTuning: it runs the tuner Job and grants the Job's
Role (operator/paged_operator/tuning_manifests.py), so it holds what that Role grants
(Kubernetes refuses a Role granting more than its creator has): hence also create and
delete on pagedinferenceservices in pio.rules (trial services).
*/}}
{{- define "pio.tuningRules" -}}
- apiGroups: [serving.pagedinference.dev]
  resources: [pagedinferencetunings]
  verbs: [get, list, watch, patch]
- apiGroups: [serving.pagedinference.dev]
  resources: [pagedinferencetunings/status]
  verbs: [get, patch]
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, delete]
{{- end }}
