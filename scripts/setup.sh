#!/usr/bin/env bash
# Installs what Skyhive needs on a Debian machine that already has Go.
# Idempotent: packages already present are not reinstalled, and apt's
# package lists are refreshed only when something is missing.
set -euo pipefail

packages=(
  libopenblas-dev        # fast GEMM, loaded at run time (a pure-Go kernel is the fallback)
  dataset-fashion-mnist  # the real data set the demo and tests train on
  coinor-cbc             # independent MILP solver the allocator's exact solver is checked against
  iproute2               # network namespaces for the realistic link emulation (root only)
  dict-gcide             # English text (GCIDE dictionary) for the language models (package text)
  prometheus             # promtool checks the /metrics exposition in the observability tests
  chromium               # headless browser the dashboard test drives
  python3-torch          # PyTorch, for the Python package's tests (python/)
  python3-numpy
  python3-pytest         # runs the Python tests
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "setup: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    sudo="sudo"
  fi
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Go tools used by `make test` (pinned; installed once into GOPATH/bin).
gobin="$(go env GOPATH)/bin"
if [ ! -x "$gobin/staticcheck" ]; then
  echo "setup: installing staticcheck"
  go install honnef.co/go/tools/cmd/staticcheck@v0.7.0
fi

go mod download
echo "setup: ok"
