#!/usr/bin/env bash
# Builds jax_ar's compiled modules on the CPU machine for the GPU machine,
# so that a GPU session spends no device time compiling (about 190 s there):
# a wheel for the device's Python (3.12), with the nvcc at /usr/local/cuda
# (13.0 on both machines), whose .so files are copied into jax_ar/ (ignored
# by git). The venv has the device's jax (0.11.2), to run the tests here
# first; the build itself uses the vendored FFI headers (cuda/third_party/). Then, with the
# device tool, carry them and run
#   JAX_AR_GPU_PREBUILT=1 bash scripts/gpu_run.sh all
# Usage: bash scripts/build_for_gpu.sh [VENV]   (default /tmp/venv312: made
# with pyenv's 3.12.1 and jax==0.11.2 when missing)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-/tmp/venv312}"
JAX_VERSION="${JAX_AR_GPU_JAX:-0.11.2}"
if [ ! -x "$VENV/bin/python" ]; then
  "${PYENV_ROOT:-$HOME/.pyenv}/versions/3.12.1/bin/python" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q "jax==$JAX_VERSION" "jaxlib==$JAX_VERSION" nanobind \
    scikit-build-core cmake ninja numpy
fi
WHEELS="$(mktemp -d)"
PATH="/usr/local/cuda/bin:$PATH" CMAKE_CUDA_ARCHITECTURES="${CMAKE_CUDA_ARCHITECTURES:-90}" \
  "$VENV/bin/python" -m pip wheel . --no-deps --no-build-isolation -w "$WHEELS" -q
"$VENV/bin/python" - "$WHEELS" <<'PY'
import glob, subprocess, sys, zipfile
wheel = glob.glob(f"{sys.argv[1]}/jax_ar-*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith("jax_ar/_jax_ar_") and name.endswith(".so"):
            open(name, "wb").write(z.read(name))
            print("jax_ar/ <-", name)
import jax
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                        text=True).stdout.strip()
nvcc = subprocess.run(["/usr/local/cuda/bin/nvcc", "--version"], capture_output=True,
                      text=True).stdout.strip().splitlines()[-1]
open("jax_ar/PREBUILT", "w").write(
    f"commit {commit}, Python {sys.version.split()[0]}, jax {jax.__version__}, {nvcc}\n")
PY
rm -rf "$WHEELS"
