{{/*
Chart name, truncated to the 63 characters a label value allows.
*/}}
{{- define "infertune.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: the prefix of every object this chart creates. The release name alone when it already
contains the chart name (release "infertune" -> "infertune"), else "<release>-<chart>".
Truncated to 57 characters so that "<fullname>-tuner" still fits in 63.
*/}}
{{- define "infertune.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 57 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 57 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 57 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "infertune.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Standard labels (https://kubernetes.io/docs/concepts/overview/working-with-objects/common-labels/).
*/}}
{{- define "infertune.commonLabels" -}}
helm.sh/chart: {{ include "infertune.chart" . }}
app.kubernetes.io/name: {{ include "infertune.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: infertune
{{- end }}

{{/*
Labels of the operator's objects (common labels + component).
*/}}
{{- define "infertune.labels" -}}
{{ include "infertune.commonLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "infertune.selectorLabels" -}}
app.kubernetes.io/name: {{ include "infertune.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "infertune.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "infertune.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The ClusterRole that tuner Jobs run under; the operator binds it (RoleBinding) to the tuner
ServiceAccount in each namespace it tunes in. INFERTUNE_TUNER_CLUSTERROLE carries this name.
*/}}
{{- define "infertune.tunerClusterRole" -}}
{{- printf "%s-tuner" (include "infertune.fullname" .) }}
{{- end }}

{{/*
"<repository>:<tag>" of image.<which> (operator, tuner or triton). The repository is
image.<which>.repository when set. Else, for the operator and the tuner only:
"<image.registry>/infertune-<which>", the names scripts/images.sh pushes (one flat name per image
under the registry prefix: Docker Hub allows no deeper path), or, with no registry either,
"infertune/<which>", the local names of the Dockerfile's header and scripts/kind-e2e.sh (not
published anywhere: a cluster other than kind cannot pull them). The tag is image.<which>.tag,
else the chart's appVersion, which is also the tag scripts/images.sh pushes by default.
*/}}
{{- define "infertune.image" -}}
{{- $img := index .root.Values.image .which }}
{{- $repository := $img.repository }}
{{- if not $repository }}
{{- $registry := .root.Values.image.registry | default "" | trimSuffix "/" }}
{{- if $registry }}
{{- $repository = printf "%s/infertune-%s" $registry .which }}
{{- else }}
{{- $repository = printf "infertune/%s" .which }}
{{- end }}
{{- end }}
{{- printf "%s:%s" $repository (default .root.Chart.AppVersion $img.tag) }}
{{- end }}

{{/*
Arguments of `infertune operator`. Kopf serves its liveness endpoint on 8080.
*/}}
{{- define "infertune.operatorArgs" -}}
- operator
- --liveness
- http://0.0.0.0:8080/healthz
{{- if .Values.watchNamespaces }}
{{- range .Values.watchNamespaces }}
- --namespace
- {{ . | quote }}
{{- end }}
{{- else }}
- --all-namespaces
{{- end }}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{/*
Rules for what the operator does inside the namespaces it watches: reconcile InferenceDeployments
(Kopf keeps finalizers and progress annotations on them, status through the subresource), run
tuner Jobs, keep TuningResults/reports in ConfigMaps, deploy Triton (Deployment + Service), read
tuner pods and their logs, post events, and give tuner Jobs their ServiceAccount and RoleBinding.
No wildcards: a test renders the chart and fails on any "*".
*/}}
{{- define "infertune.namespacedRules" -}}
- apiGroups: ["infertune.io"]
  resources: ["inferencedeployments"]
  verbs: ["get", "list", "watch", "patch", "update"]
- apiGroups: ["infertune.io"]
  resources: ["inferencedeployments/status"]
  verbs: ["get", "patch", "update"]
# Owner references with blockOwnerDeletion on the objects the operator creates need this where
# the OwnerReferencesPermissionEnforcement admission plugin is on (OpenShift, hardened clusters).
- apiGroups: ["infertune.io"]
  resources: ["inferencedeployments/finalizers"]
  verbs: ["update"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
# The serving Deployment, Service and model-repo ConfigMap are server-side applied: a PATCH
# (application/apply-patch+yaml), which also needs "create" when the apply creates the object.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "update"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "patch", "update"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["pods/log"]
  verbs: ["get"]
{{- if .Values.observe.podProxy }}
# The observed workload: each serving pod's metrics endpoint (port 8002), read through the API
# server's pod proxy (docs/operator.md, The observed workload).
- apiGroups: [""]
  resources: ["pods/proxy"]
  verbs: ["get"]
{{- end }}
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["get", "create"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["rolebindings"]
  verbs: ["get", "create"]
# Lets the operator create RoleBindings to the tuner ClusterRole, and to no other role.
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["clusterroles"]
  verbs: ["bind"]
  resourceNames: [{{ include "infertune.tunerClusterRole" . | quote }}]
{{- end }}

{{/*
Cluster-scoped reads Kopf needs whatever the watch scope: CRD discovery and namespace listing.
*/}}
{{- define "infertune.clusterRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["get", "list", "watch"]
{{- end }}
