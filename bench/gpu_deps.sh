#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Run HERE (a Debian 12 machine with apt), before bench/gpu_check.sh is sent to a GPU machine
# that reaches no package registry: downloads the -dev packages the build needs and that such
# an image may lack (xxHash, zstd, LZ4, nlohmann-json, CLI11, GoogleTest, liburing, libaio,
# pkg-config) as .deb files into .gpu-deps/ (in .gitignore). gpu_check.sh
# unpacks them into a private prefix there; nothing is installed system-wide. About 6 MiB.
# Usage: bench/gpu_deps.sh   (then carry `.gpu-deps` with the device run)
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpu-deps
cd .gpu-deps
packages=(libxxhash-dev libxxhash0 libzstd-dev libzstd1 liblz4-dev liblz4-1 nlohmann-json3-dev libcli11-dev
          libgtest-dev libgmock-dev liburing-dev liburing2 libaio-dev libaio1 pkgconf
          pkgconf-bin libpkgconf3)
for p in "${packages[@]}"; do
  ls "${p}"_*.deb >/dev/null 2>&1 || apt-get download -q "$p" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true
done
ls -la
du -sh .
