#!/usr/bin/env bash
# Build the operator and tuner images (the Dockerfile's two targets) and push them to a registry,
# under the names the Helm chart derives from its value image.registry:
#
#   scripts/images.sh REGISTRY [TAG]
#       -> REGISTRY/infertune-operator:TAG and REGISTRY/infertune-tuner:TAG
#   helm install infertune charts/infertune ... --set image.registry=REGISTRY
#
# REGISTRY is a registry host plus, if it needs one, a path prefix: registry.example.com/ml,
# registry.example.com:5000, localhost:5000/infertune.
# Each image is one flat name under it (infertune-operator, not infertune/operator) because
# Docker Hub accepts no deeper path than namespace/name. TAG defaults to the chart's appVersion
# (charts/infertune/Chart.yaml), which is also the tag the chart uses when image.*.tag is empty,
# so the default needs no tag on the helm command line.
#
# Needs Docker with BuildKit (`docker buildx`, Docker 23+) and a `docker login` to REGISTRY
# (some registries also need the two repositories created first). --help and --dry-run
# need neither.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CHART_YAML="$ROOT/charts/infertune/Chart.yaml"

usage() {
  cat <<EOF
usage: scripts/images.sh [--dry-run] [--only operator|tuner] [--platform LIST] REGISTRY [TAG]

Builds the Dockerfile's targets and pushes them as
  REGISTRY/infertune-operator:TAG   (the operator; also simulated tuner Jobs and endpoints)
  REGISTRY/infertune-tuner:TAG      (Triton + TensorRT-LLM + infertune, for real GPUs; large)
then prints the helm command that installs the chart with them (--set image.registry=REGISTRY).

  REGISTRY         registry and path prefix, e.g. registry.example.com/ml or localhost:5000
  TAG              image tag (default: the chart's appVersion, $(app_version 2>/dev/null || echo '?'))
  --dry-run        print the docker commands instead of running them (needs no Docker)
  --only TARGET    build and push one image only: operator (enough for the simulated backend)
                   or tuner
  --platform LIST  passed to docker buildx build, e.g. linux/amd64 when building on an arm64
                   machine for amd64 nodes (several platforms need a docker-container builder:
                   docker buildx create --use)
  -h, --help       this text
EOF
}

fail() {
  printf 'error: %s\n' "$*" >&2
  exit 1
}

die() {
  printf 'error: %s\n' "$*" >&2
  printf 'usage: scripts/images.sh [--dry-run] [--only operator|tuner] [--platform LIST] REGISTRY [TAG]\n' >&2
  printf '       (scripts/images.sh --help for more)\n' >&2
  exit 2
}

app_version() {
  local version
  version="$(sed -n 's/^appVersion:[[:space:]]*["'\'']\{0,1\}\([^"'\'' ]*\)["'\'']\{0,1\}[[:space:]]*$/\1/p' "$CHART_YAML")"
  [[ -n "$version" ]] || return 1
  printf '%s\n' "$version"
}

DRY_RUN=0
ONLY=""
PLATFORM=""
ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h | --help)
      usage
      exit 0
      ;;
    --dry-run)
      DRY_RUN=1
      ;;
    --only)
      [[ $# -ge 2 ]] || die "--only needs operator or tuner"
      ONLY="$2"
      shift
      ;;
    --only=*)
      ONLY="${1#--only=}"
      ;;
    --platform)
      [[ $# -ge 2 ]] || die "--platform needs a platform list, e.g. linux/amd64"
      PLATFORM="$2"
      shift
      ;;
    --platform=*)
      PLATFORM="${1#--platform=}"
      ;;
    --)
      shift
      ARGS+=("$@")
      break
      ;;
    -*)
      die "unknown option $1"
      ;;
    *)
      ARGS+=("$1")
      ;;
  esac
  shift
done

[[ ${#ARGS[@]} -ge 1 ]] || die "missing REGISTRY (e.g. registry.example.com/ml)"
[[ ${#ARGS[@]} -le 2 ]] || die "too many arguments: ${ARGS[*]}"

# A trailing slash is forgiven here as in the chart (registry.example.com/ml/ = registry.example.com/ml).
REGISTRY="${ARGS[0]%/}"
[[ -n "$REGISTRY" ]] || die "REGISTRY is empty"
[[ "$REGISTRY" != *://* ]] || die "REGISTRY is a registry name, not a URL: drop the scheme from $REGISTRY"
# The same form values.schema.json accepts for image.registry: host[:port][/path...].
[[ "$REGISTRY" =~ ^[a-zA-Z0-9][^[:space:]:@/]*(:[0-9]+)?(/[^[:space:]:@/]+)*$ ]] ||
  die "REGISTRY must look like host[:port][/path], e.g. registry.example.com/ml (got '$REGISTRY')"

if [[ ${#ARGS[@]} -ge 2 ]]; then
  TAG="${ARGS[1]}"
else
  TAG="$(app_version)" || fail "no appVersion in $CHART_YAML"
fi
[[ "$TAG" =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] || die "invalid tag '$TAG'"

case "$ONLY" in
  "") TARGETS=(operator tuner) ;;
  operator | tuner) TARGETS=("$ONLY") ;;
  *) die "--only takes operator or tuner, not '$ONLY'" ;;
esac

run() {
  if [[ $DRY_RUN -eq 1 ]]; then
    local quoted
    printf -v quoted '%q ' "$@"
    printf '%s\n' "${quoted% }"
  else
    printf '\n==> %s\n' "$*" >&2
    "$@"
  fi
}

if [[ $DRY_RUN -eq 0 ]]; then
  command -v docker >/dev/null || fail "docker is not on PATH (--dry-run prints the commands without it)"
  docker buildx version >/dev/null 2>&1 || fail "docker buildx is missing (Docker 23+ ships it)"
fi

cd "$ROOT"
PUSHED=()
for target in "${TARGETS[@]}"; do
  image="$REGISTRY/infertune-$target:$TAG"
  cmd=(docker buildx build --target "$target" --tag "$image")
  [[ -z "$PLATFORM" ]] || cmd+=(--platform "$PLATFORM")
  cmd+=(--push .)
  run "${cmd[@]}"
  PUSHED+=("$image")
done

# How to install the chart with what was pushed (stderr: stdout carries --dry-run's commands).
install=(helm install infertune charts/infertune --namespace infertune-system --create-namespace
  --set "image.registry=$REGISTRY")
if [[ "$TAG" != "$(app_version)" ]]; then
  install+=(--set "image.operator.tag=$TAG" --set "image.tuner.tag=$TAG")
fi
{
  if [[ $DRY_RUN -eq 1 ]]; then
    printf '\nWould push: %s\n' "${PUSHED[*]}"
  else
    printf '\nPushed: %s\n' "${PUSHED[*]}"
  fi
  printf -v line '%q ' "${install[@]}"
  printf 'Install the chart with them:\n  %s\n' "${line% }"
  if [[ "$ONLY" == operator ]]; then
    printf 'No tuner image was pushed: enough for backend simulated (add --set tuner.defaultBackend=simulated\n'
    printf 'to make it the default); real-GPU tuning needs %s too.\n' "$REGISTRY/infertune-tuner:$TAG"
  elif [[ "$ONLY" == tuner ]]; then
    printf 'The chart also expects the operator at %s.\n' "$REGISTRY/infertune-operator:$TAG"
  fi
} >&2
