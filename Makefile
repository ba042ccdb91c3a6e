# torchbandits — `make demo`, `make test`, `make bench` (`bench-all`, `bench-quick`), `make lint`,
# `make docs`.
#
# The virtual environment lives in $(VENV). torch is installed first, pinned by TORCH_SPEC
# (on this machine torch==2.13.0 is a CPU wheel on local disk; an unpinned torch would pull a
# multi-GB CUDA build). A torch that is already importable is kept as it is: point PYTHON at
# your own interpreter (`make test PYTHON=/path/to/python VENV=`) to use your environment.

VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
ifeq ($(VENV),)
PYTHON ?= python3
STAMP := .installed-system
else
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed
endif

.PHONY: install demo test lint bench bench-all bench-quick docs clean

$(STAMP): setup.cfg pyproject.toml
	@if [ -n "$(VENV)" ] && [ ! -x "$(PYTHON)" ]; then python3 -m venv $(VENV); fi
	@$(PYTHON) -c "import torch" 2>/dev/null \
		&& echo "torch already installed: keeping $$($(PYTHON) -c 'import torch; print(torch.__version__)')" \
		|| $(PYTHON) -m pip install --quiet "$(TORCH_SPEC)"
	$(PYTHON) -m pip install --quiet -e ".[dev,bo,docs,sweep]"
	@touch $@

install: $(STAMP)

demo: install
	$(PYTHON) -m torchbandits.cli run --env rkhs --policy kucb,gpucb,random \
		--horizon 300 --seeds 0 1 2 --set env.dim=2 --out results/demo --no-progress

test: install
	$(PYTHON) -m pytest -q

lint: install
	$(PYTHON) -m ruff check torchbandits tests scripts benchmarks

# bench: the exact-posterior benchmark; bench-all: every per-step timing benchmark of
# benchmarks/ (one thread each; results/bench_*/, results/*_bench/; long); bench-quick: their
# small versions (seconds to a few minutes)
BENCHMARKS ?= exact bkb ekucb confidence opkb tvbo vs_reference

bench: install
	$(PYTHON) benchmarks/bench_exact.py

bench-all: install
	@for b in $(BENCHMARKS); do echo "== benchmarks/bench_$$b.py"; \
		$(PYTHON) benchmarks/bench_$$b.py || exit 1; done

bench-quick: install
	@for b in $(BENCHMARKS); do echo "== benchmarks/bench_$$b.py --quick"; \
		$(PYTHON) benchmarks/bench_$$b.py --quick || exit 1; done

docs: install
	$(PYTHON) -m mkdocs build --strict

clean:
	rm -rf results site .cache .pytest_cache .ruff_cache
