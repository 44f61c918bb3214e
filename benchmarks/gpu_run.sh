#!/bin/bash
# The GPU machine's side of the GPU check (docs/gpu.md): install the staged wheels, then run.
#   bash benchmarks/gpu_run.sh smoke   the tiny Llama on CUDA: every section's code on the GPU, and the
#                                      numba kernels compiled (their cache stays for the next call)
#   bash benchmarks/gpu_run.sh full    SmolLM2 once every part of .gpu has arrived
#   bash benchmarks/gpu_run.sh stage   nothing but install what has arrived (a call that only carries a part)
#   bash benchmarks/gpu_run.sh build-llama   build the staged llama-cpp-python source with CUDA (Hopper),
#                                      timed, into .gpu/llama-site (then SECTIONS=llamacpp ... full)
# Results go to $OUT (the device tool's folder) or bench_out/gpu; DEADLINE (seconds, default 420):
# no dataset starts after it, so the command ends inside the call's limit with every finished part;
# SECTIONS (default hf,onnx,llamacpp): the parts to run, e.g. SECTIONS=onnx once onnxruntime-gpu is here.
set -u
cd "$(dirname "$0")/.."
SITE=.gpu/site
# draftcore itself too: its adapters/ folder is the package draftcore.adapters only once installed
python3 -m pip install -q --no-index --no-deps --no-build-isolation --upgrade --target "$SITE" . .gpu/a/*.whl || exit 1
export PYTHONPATH="$PWD/$SITE" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
# staged wheels (onnxruntime-gpu) once all their parts are here, ahead of the machine's CPU onnxruntime
WHEELS=$(python3 benchmarks/gpu_stage.py --assembled-wheels)
if [ -n "$WHEELS" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target .gpu/wheel-site $WHEELS || exit 1
  export PYTHONPATH="$PWD/.gpu/wheel-site:$PYTHONPATH"
fi
if [ -d .gpu/llama-site ]; then export PYTHONPATH="$PWD/.gpu/llama-site:$PYTHONPATH"; fi
# a llama-cpp-python CUDA build links libcudart.so.13 and libcublas.so.13: torch's nvidia-* packages have them
NVIDIA_LIBS=$(python3 -c "import nvidia, os; print(':'.join(os.path.join(p, 'cu13', 'lib') for p in nvidia.__path__))" 2>/dev/null)
if [ -n "$NVIDIA_LIBS" ]; then export LD_LIBRARY_PATH="$NVIDIA_LIBS:${LD_LIBRARY_PATH:-}"; fi
RESULTS="${OUT:-bench_out/gpu}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
case "${1:-}" in
  smoke) python3 benchmarks/gpu_check.py --device cuda --model tiny --out "$RESULTS/smoke" ;;
  full)  python3 benchmarks/gpu_check.py --device cuda --deadline "${DEADLINE:-420}" \
           --sections "${SECTIONS:-hf,onnx,llamacpp}" --out "$RESULTS/full" ;;
  stage) python3 -c "import onnxruntime as o; print('onnxruntime', o.__version__, o.get_available_providers())"; exit ;;
  build-llama)
    SOURCE=$(python3 benchmarks/gpu_stage.py --assembled-source)
    [ -n "$SOURCE" ] || { echo "llama-cpp-python's source has not all arrived" >&2; exit 1; }
    start=$(date +%s)
    CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
      python3 -m pip install -q --no-index --no-deps --no-build-isolation --upgrade --target .gpu/llama-site "$SOURCE"
    status=$?
    echo "llama-cpp-python with CUDA: exit $status after $(( $(date +%s) - start )) s"
    exit $status ;;
  *) echo "usage: gpu_run.sh smoke|full|stage|build-llama" >&2; exit 2 ;;
esac
status=$?
cat "$RESULTS/$1/gpu_check.md"   # into the call's output too, should its files not come back
exit $status
