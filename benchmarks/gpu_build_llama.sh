#!/bin/bash
# llama-cpp-python with CUDA (Hopper, sm_90), built HERE, with no GPU, for the GPU check's llama.cpp
# section (docs/gpu.md): PyPI has no CUDA wheel of it, and a build on the GPU machine would spend its
# few minutes on nvcc. The CUDA toolkit comes from NVIDIA's own PyPI wheels, at the versions torch
# 2.11.0 (the GPU machine's) depends on, so the libraries the wheel links against are the ones
# already there; the wheel is `py3-none-linux_x86_64` (ctypes), whatever the machine's Python.
#   bash benchmarks/gpu_build_llama.sh        -> .gpu-build/wheel/llama_cpp_python-0.3.36-*.whl (~50 MiB)
#   python benchmarks/gpu_stage.py --llama-cpp-wheel .gpu-build/wheel/llama_cpp_python-*.whl
# On 2026-11-27 it took 24 minutes on 2 cores, most of it nvcc on ggml-cuda's template kernels (docs/gpu.md).
set -eu
cd "$(dirname "$0")/.."
BUILD="$PWD/.gpu-build"
PYTHON="${PYTHON:-$PWD/.venv/bin/python}"
LLAMA_CPP="llama-cpp-python==0.3.36"
# torch 2.11.0's CUDA 13 runtime and cuBLAS; nvcc, cicc (nvvm), the CRT and CCCL headers of that release
TOOLKIT=("nvidia-cuda-nvcc==13.0.88" "nvidia-nvvm==13.0.88" "nvidia-cuda-crt==13.0.88" "nvidia-cuda-cccl==13.0.85"
         "nvidia-cuda-runtime==13.0.96" "nvidia-cublas==13.1.0.3")
mkdir -p "$BUILD/toolkit-wheels" "$BUILD/source" "$BUILD/full" "$BUILD/wheel"
"$PYTHON" -m pip download -q --no-deps -d "$BUILD/toolkit-wheels" "${TOOLKIT[@]}"
"$PYTHON" -m pip download -q --no-deps --no-binary=:all: -d "$BUILD/source" "$LLAMA_CPP"
# The wheels unpack into one CUDA 13 tree (bin/nvcc, nvvm/, include/, lib/): what CMake's
# FindCUDAToolkit expects, once the unversioned library names it links by exist.
CUDA="$BUILD/toolkit/nvidia/cu13"
if [ ! -x "$CUDA/bin/nvcc" ]; then
  for wheel in "$BUILD"/toolkit-wheels/*.whl; do "$PYTHON" -m zipfile -e "$wheel" "$BUILD/toolkit"; done
  chmod +x "$CUDA"/bin/* "$CUDA"/nvvm/bin/*
  for lib in cudart cublas cublasLt; do ln -sf "lib$lib.so.13" "$CUDA/lib/lib$lib.so"; done
  ln -sfn lib "$CUDA/lib64"
fi
# NO_VMM: no link to the driver library (libcuda), which only the GPU machine has
export PATH="$CUDA/bin:$PATH" CUDA_HOME="$CUDA" CUDA_PATH="$CUDA" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)"
export CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_NO_VMM=ON -DGGML_NATIVE=OFF
  -DCMAKE_CUDA_COMPILER=$CUDA/bin/nvcc -DCUDAToolkit_ROOT=$CUDA"
start=$(date +%s)
"$PYTHON" -m pip wheel -q --no-deps --no-cache-dir -w "$BUILD/full" "$BUILD"/source/llama_cpp_python-*.tar.gz
echo "llama-cpp-python with CUDA (sm_90): built in $(( $(date +%s) - start )) s"
# The wheel holds each library six times (lib/ and llama_cpp/lib/, under three names each: zip has no
# symlinks), 255 MiB. Kept: llama_cpp/lib's libraries under the names that are loaded, ctypes' (libllama.so,
# libmtmd.so) and the sonames their dependents ask for (libggml-cuda.so.0, ...): one copy of libggml-cuda
# (60 MB), with RECORD rewritten to match. (--no-cache-dir: pip caches a built wheel without its CMAKE_ARGS, and
# could hand back a CPU build.)
"$PYTHON" - "$BUILD"/full/llama_cpp_python-*.whl "$BUILD/wheel" <<'SLIM'
import re, sys, zipfile
from pathlib import Path
source, out = Path(sys.argv[1]), Path(sys.argv[2])

def kept(name):
    if not name.startswith("llama_cpp/lib/"):
        return not name.startswith(("lib/", "include/", "bin/"))
    library = name.rsplit("/", 1)[1]
    return library in ("libllama.so", "libmtmd.so") or re.fullmatch(r"lib[\w-]+\.so\.0", library) is not None

with zipfile.ZipFile(source) as whole, zipfile.ZipFile(out / source.name, "w", zipfile.ZIP_DEFLATED) as slim:
    for info in whole.infolist():
        if kept(info.filename):
            data = whole.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                data = "".join(line for line in data.decode().splitlines(True)
                               if kept(line.split(",", 1)[0])).encode()
            slim.writestr(info, data)
print(f"{out / source.name}: {(out / source.name).stat().st_size / 2**20:.0f} MiB")
SLIM
