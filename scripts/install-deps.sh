#!/usr/bin/env bash
# Installs moelab's Debian packages. Idempotent: does nothing when all are present.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git
  libopenblas-openmp-dev nlohmann-json3-dev libsqlite3-dev sqlite3 libssl-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libceres-dev libeigen3-dev libsentencepiece-dev sentencepiece
  libcli11-dev libfmt-dev libmuparser-dev zlib1g-dev libzstd-dev
  libopenmpi-dev openmpi-bin slurm-wlm munge
  libimgui-dev libglfw3-dev libgl-dev libstb-dev xvfb xauth
  bible-kjv bible-kjv-text wordnet-base
  clang-14 libclang-rt-14-dev  # scripts/fuzz.sh: libFuzzer targets with ASan + UBSan (fuzz/)
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get -o DPkg::Lock::Timeout=600 update -q
$SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${missing[@]}"
