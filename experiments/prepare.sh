#!/usr/bin/env bash
# Builds main and one variant of this folder for a device A/B, on the CPU
# machine (about 3 minutes each; scripts/build_for_gpu.sh):
#   bash experiments/prepare.sh NAME      # NAME.patch -> branch ab-NAME in ab/NAME
# Leaves main's modules under jax_ar/ (the root modules), the variant's
# jax_ar packed in ab/NAME.tar.gz, and the LL floor probe in probes/
# (from ${SHARED:-../shared}/probes).
set -euo pipefail
cd "$(dirname "$0")/.."
name="$1"
if [ ! -d "ab/$name" ]; then
  git worktree add -q "ab/$name" -b "ab-$name"
  git -C "ab/$name" -c user.name=jax_ar -c user.email=jax_ar@local am -q \
    "$PWD/experiments/$name.patch"
fi
(cd "ab/$name" && bash scripts/build_for_gpu.sh)
(cd "ab/$name" && tar --exclude=__pycache__ -czf "../$name.tar.gz" jax_ar)
[ -e jax_ar/PREBUILT ] && grep -q "commit $(git rev-parse --short HEAD)," jax_ar/PREBUILT \
  || bash scripts/build_for_gpu.sh
mkdir -p probes && cp "${SHARED:-../shared}"/probes/* probes/ && chmod -R u+w probes
du -shc jax_ar/_jax_ar_*.so "ab/$name.tar.gz" probes | tail -1
