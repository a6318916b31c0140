# make demo: install, then the benchmark of codecs and algorithms against MPI_Allreduce (4 ranks)
# make test: install, then every test: serial (and MPI tests at 1 rank), then MPI tests at 2..5 ranks
# make bench-cluster: the same benchmark on an emulated cluster (root; HOSTS=4 RATE=1gbit)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
MPIEXEC := $(VENV)/bin/mpiexec
NPROCS ?= 2 3 4 5
HOSTS ?= 4
RATE ?= 1gbit
# Per-test limit (pytest-timeout, thread method: a stuck rank dies) and per-run limit.
TEST_TIMEOUT ?= 300
RUN_TIMEOUT ?= 1200
export MPIEXEC_TIMEOUT := $(RUN_TIMEOUT)
export HYDRA_LAUNCHER := fork
export CCL_NUMBA_CACHE := 1
export NUMBA_CACHE_DIR := $(CURDIR)/.numba_cache
# pytest-mpi: --with-mpi runs everything (MPI tests at the launched size); --only-mpi alone
# runs just the MPI-marked tests (given together, --with-mpi wins and --only-mpi is ignored).
PYTEST := -m mpi4py -m pytest -x -q --timeout=$(TEST_TIMEOUT) --timeout-method=thread
# Pinned exactly and installed before the extras: an open torch range pulls GBs of CUDA wheels.
TORCH_PIN ?= torch==2.13.0

.PHONY: demo test test-serial test-mpi install-test install-demo bench-cluster clean

$(VENV)/.demo: setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[mpich,bench]'
	touch $@

$(VENV)/.test: setup.py $(VENV)/.demo
	$(PY) -m pip install -q '$(TORCH_PIN)'
	$(PY) -m pip install -q -e '.[test,mpich,bench,torch]'
	@# the emulated-cluster tests need iproute2 (ip, tc); as root, install it if missing
	command -v ip >/dev/null || [ "$$(id -u)" != 0 ] || \
	  (apt-get update -qq && apt-get install -y -qq iproute2) || true
	touch $@

install-demo: $(VENV)/.demo
install-test: $(VENV)/.test

demo: install-demo
	$(PY) -c "import ccl; ccl.warmup()"
	$(MPIEXEC) -n 4 $(PY) -m mpi4py -m ccl.bench --quick

bench-cluster: install-demo
	$(PY) -c "import ccl; ccl.warmup()"
	$(PY) -m ccl.bench.cluster --hosts $(HOSTS) --rate $(RATE) -- $(PY) -m mpi4py -m ccl.bench --quick

test: install-test
	$(PY) -c "import ccl; ccl.warmup()"
	$(MAKE) test-serial test-mpi

test-serial:
	timeout --kill-after=30 $(RUN_TIMEOUT) $(PY) $(PYTEST) --with-mpi

test-mpi:
	set -e; for n in $(NPROCS); do \
	  echo "== MPI tests at $$n ranks"; \
	  timeout --kill-after=30 $(RUN_TIMEOUT) $(MPIEXEC) -n $$n $(PY) $(PYTEST) --only-mpi; \
	done

clean:
	rm -rf $(VENV) .numba_cache bench-out *.egg-info
