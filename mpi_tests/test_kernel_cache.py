"""Compiled kernels are cached per user by default: only the first process on a machine compiles.

The end-to-end tests launch real jobs with a fresh home and cache and no
caching variable set (``NUMBA_CACHE_DIR``, ``CCL_NUMBA_CACHE`` and
``XDG_CACHE_HOME`` removed from what this suite runs with), and read numba's
own counters (``dispatcher.stats``) in the launched ranks: a kernel loaded
from the cache counts a hit, a compiled one a miss.
"""

import json
import os
import stat
import subprocess
import sys
import tempfile

import numba
import numpy as np
import pytest

from ccl import _jit
from mpi_tests.helpers.launch import ROOT, mpiexec

JOB_TIMEOUT = 600
FIRST_CALLS = os.path.join(ROOT, "mpi_tests", "harness", "first_calls.py")


def clean_env(home, **extra):
    """This process' environment with a fresh home and cache, nothing of numba's cache set."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_CACHE_DIR", "CCL_NUMBA_CACHE", "XDG_CACHE_HOME")
           and not k.startswith(("PMI_", "OMPI_", "SLURM_"))}
    env.update(HOME=str(home), HYDRA_LAUNCHER="fork", MPIEXEC_TIMEOUT=str(JOB_TIMEOUT),
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    env.update({k: str(v) for k, v in extra.items()})
    return env


def first_calls(env, ranks, codecs):
    """Launch harness/first_calls.py; return its JSON line (seconds, hits and misses per rank)."""
    if mpiexec() is None:
        pytest.skip("no mpiexec on PATH")
    result = subprocess.run([mpiexec(), "-n", str(ranks), sys.executable, "-m", "mpi4py",
                             FIRST_CALLS, *codecs], capture_output=True, text=True, env=env,
                            timeout=JOB_TIMEOUT + 30, cwd=ROOT)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "Warning" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def index_files(root):
    """numba's index files (one per cached kernel) anywhere below ``root``, hidden folders too."""
    return [os.path.join(folder, name) for folder, _, names in os.walk(root)
            for name in names if name.endswith(".nbi")]


@pytest.mark.serial
def test_second_process_loads_every_kernel_after_four_ranks_cold_start(tmp_path):
    """4 ranks compile and save at once into an empty cache; a new job then compiles nothing."""
    codecs = ["3lc", "thc", "onebit", "sidco"]
    env = clean_env(tmp_path / "home")
    cold = first_calls(env, 4, codecs)
    assert min(cold["misses"]) > 0  # the cache was empty: every rank compiled
    saved = index_files(tmp_path / "home" / ".cache" / "ccl" / "numba")
    assert saved, "nothing was cached under ~/.cache/ccl/numba"
    warm = first_calls(env, 2, codecs)
    assert warm["misses"] == [0, 0], warm  # not one kernel compiled
    assert min(warm["hits"]) > 0
    assert sorted(index_files(tmp_path / "home")) == sorted(saved)  # no new index: no new code


@pytest.mark.serial
def test_xdg_cache_home_is_respected(tmp_path):
    env = clean_env(tmp_path / "home", XDG_CACHE_HOME=tmp_path / "xdg")
    assert min(first_calls(env, 2, ["bf16"])["misses"]) > 0  # bf16 has kernels to compile
    assert index_files(tmp_path / "xdg" / "ccl" / "numba")
    assert not index_files(tmp_path / "home")
    assert first_calls(env, 2, ["bf16"])["misses"] == [0, 0]


@pytest.mark.serial
def test_explicit_numba_cache_dir_wins(tmp_path):
    env = clean_env(tmp_path / "home", XDG_CACHE_HOME=tmp_path / "xdg",
                    NUMBA_CACHE_DIR=tmp_path / "explicit")
    first_calls(env, 2, ["bf16"])
    assert index_files(tmp_path / "explicit")
    assert not index_files(tmp_path / "xdg") and not index_files(tmp_path / "home")


@pytest.mark.serial
def test_read_only_home_falls_back_to_the_temporary_directory(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    # a file where the cache folder would go: unwritable even for root, who ignores modes
    (home / ".cache").write_text("")
    home.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        env = clean_env(home, TMPDIR=tmp_path / "tmp")
        (tmp_path / "tmp").mkdir()
        first_calls(env, 2, ["bf16"])  # no error, no warning (checked by first_calls)
        assert index_files(tmp_path / "tmp" / f"ccl-numba-{os.getuid()}")
        assert first_calls(env, 2, ["bf16"])["misses"] == [0, 0]
    finally:
        home.chmod(stat.S_IRWXU)


@pytest.mark.serial
def test_caching_can_be_turned_off(tmp_path):
    env = clean_env(tmp_path / "home", CCL_NUMBA_CACHE="0")
    assert min(first_calls(env, 2, ["bf16"])["misses"]) > 0
    assert first_calls(env, 2, ["bf16"])["hits"] == [0, 0]
    assert not index_files(tmp_path)


def test_cache_directory_rules(tmp_path, monkeypatch):
    """Which directory, in which order, without launching anything."""
    home, xdg = tmp_path / "home", tmp_path / "xdg"
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setenv("HOME", str(home))
    digest = os.path.basename(_jit.cache_directory({"XDG_CACHE_HOME": str(xdg)}))
    assert digest.startswith("kernels-")
    assert _jit.cache_directory({}) == str(home / ".cache" / "ccl" / "numba" / digest)
    assert _jit.cache_directory({"XDG_CACHE_HOME": str(xdg)}) == \
        str(xdg / "ccl" / "numba" / digest)
    assert _jit.cache_directory({"XDG_CACHE_HOME": "relative"}) == \
        str(home / ".cache" / "ccl" / "numba" / digest)  # the XDG spec ignores relative paths
    assert _jit.cache_directory({"NUMBA_CACHE_DIR": "/elsewhere",
                                 "XDG_CACHE_HOME": str(xdg)}) == "/elsewhere"
    assert _jit.cache_directory({"CCL_NUMBA_CACHE": "0", "XDG_CACHE_HOME": str(xdg)}) is None
    blocked = tmp_path / "blocked"
    blocked.write_text("")  # a file: nothing can be made below it
    assert _jit.cache_directory({"XDG_CACHE_HOME": str(blocked)}) == \
        str(tmp_path / "tmp" / f"ccl-numba-{os.getuid()}" / digest)
    monkeypatch.setattr(tempfile, "tempdir", str(blocked))
    assert _jit.cache_directory({"XDG_CACHE_HOME": str(blocked)}) is None


def test_old_source_trees_are_pruned(tmp_path):
    root = tmp_path / "numba"
    old, recent = root / "kernels-old", root / "kernels-recent"
    for path in (old, recent):
        path.mkdir(parents=True)
    stale = os.stat(old).st_mtime - (_jit._KEEP_DAYS + 1) * 86400
    os.utime(old, (stale, stale))
    _jit._prune(str(root), "kernels-recent")
    assert not old.exists() and recent.exists()


def test_kernels_save_under_the_lock():
    """Every cached kernel of ccl saves through the locked index (numba's internals checked)."""
    import ccl.codecs  # noqa: F401  (imports every codec's kernels)

    assert _jit.kernels()
    if _jit.cache_directory() is None:
        pytest.skip("kernel caching is off here")
    for kernel in _jit.kernels():
        assert isinstance(kernel._cache._cache_file, _jit._LockedIndex), kernel


def test_locked_index_keeps_every_entry(tmp_path):
    """Saves of different signatures each keep their entry and their own data file."""
    from numba.core.caching import IndexDataCacheFile

    files = [_jit._LockedIndex.__new__(_jit._LockedIndex) for _ in range(2)]
    for f in files:  # two processes' views of one function's index
        f.__dict__.update(IndexDataCacheFile(str(tmp_path), "k-1.py311", "stamp").__dict__)
    files[0].save("sig-a", b"a")
    files[1].save("sig-b", b"b")
    assert files[0].load("sig-a") == b"a" and files[0].load("sig-b") == b"b"


def _doubled(x, out):
    for i in numba.prange(x.size):
        out[i] = 2.0 * x[i]


def test_parallel_and_serial_variants_are_cached_apart(tmp_path):
    """One function's serial and parallel kernels each load their own code from the cache.

    numba keys a cached kernel by signature and CPU, not by its options: the
    serial variant saved first was once what the parallel one loaded too (a
    cache filled by ranks with one thread each then ran every later 2-thread
    process's "parallel" kernels on one thread: onebit encoded 1.9x slower).
    """
    x = np.arange(10.0)

    def in_a_new_process(**options):
        kernel = _jit._cached(numba.njit(nogil=True, **options)(_doubled), str(tmp_path))
        out = np.empty_like(x)
        kernel(x, out)
        np.testing.assert_array_equal(out, 2 * x)
        return sum(kernel.stats.cache_hits.values()), sum(kernel.stats.cache_misses.values())

    assert in_a_new_process() == (0, 1)  # the serial variant compiles and is saved
    assert in_a_new_process(parallel=True) == (0, 1)  # compiles: the serial code is not its own
    assert in_a_new_process(parallel=True) == (1, 0)
    assert in_a_new_process() == (1, 0)
    assert _jit._options_tag({"nopython": True, "nogil": True, "boundscheck": None}) == ""
    assert _jit._options_tag({"nogil": True, "parallel": True, "fastmath": True}) == \
        "fastmath-parallel"


def test_a_folder_others_may_write_is_not_used(tmp_path, monkeypatch):
    """A cache someone else could fill with code (a shared /tmp name taken first) is refused."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    shared = tmp_path / "tmp" / f"ccl-numba-{os.getuid()}"
    shared.mkdir(parents=True)
    shared.chmod(0o777)
    blocked = tmp_path / "blocked"
    blocked.write_text("")
    assert _jit.cache_directory({"XDG_CACHE_HOME": str(blocked), "HOME": str(blocked)}) is None
    shared.chmod(0o700)
    assert _jit.cache_directory({"XDG_CACHE_HOME": str(blocked)}).startswith(str(shared))
