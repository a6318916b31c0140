"""The project-wide numba ``njit`` wrapper with ccl's house defaults.

Kernels release the GIL (``nogil=True``) so they can overlap MPI waits in
other threads, and are cached on disk by default, so that only the first
process on a machine waits for numba to compile them (see
:func:`cache_directory` for where; ``CCL_NUMBA_CACHE=0`` turns caching off).

Several ranks starting together may compile the same kernel and save it at
the same moment. numba writes each file atomically, but its index (one per
function) is read, updated and written back, and a new entry takes the first
free data-file number: two processes saving different signatures at once
could lose an entry or, worse, point one signature at another's code. ccl's
kernels therefore save under an exclusive lock on a file beside the index
(``_LockedIndex``), writing the data before the index entry that names it.
A kernel compiled with other options than ccl's usual ones (``parallel``)
is filed under its function's name plus those options: numba's key holds
the signature and the CPU only, so a function's serial and parallel kernels
would otherwise load each other's code.
"""

import contextlib
import hashlib
import os
import shutil
import tempfile
import threading
import time
import uuid

import numba
from numba.core import caching

from . import config

__all__ = ["njit", "prange", "cache_enabled", "cache_directory", "kernels"]

prange = numba.prange

_KERNELS = []  # every dispatcher njit made, for warm-up checks and tests
_DECORATING = threading.Lock()  # numba.config.CACHE_DIR is set around each decoration
_DIRECTORY = []  # the directory chosen on first use, cached (one entry)


def cache_enabled():
    """Return whether compiled kernels are cached on disk (``CCL_NUMBA_CACHE``, default on)."""
    return config.read("CCL_NUMBA_CACHE") is not False


def _source_digest():
    """A digest of ccl's version, of every module that defines or feeds a kernel, and of numba's.

    numba keys a cached kernel on its own file's content, not on the files of
    the kernels it calls: a directory per digest keeps the cache of one ccl
    source tree (a release, or an edited checkout) from serving another's.
    numba's version is in it too: numba drops an index written by another
    version, so two environments sharing one folder would evict each other.
    """
    digest = hashlib.sha256(numba.__version__.encode())
    here = os.path.dirname(os.path.abspath(__file__))
    codecs = os.path.join(here, "codecs")
    paths = [os.path.join(here, "__init__.py"), __file__]  # __init__ holds __version__
    paths += [os.path.join(codecs, n) for n in sorted(os.listdir(codecs)) if n.endswith(".py")]
    for path in paths:
        with open(path, "rb") as f:
            digest.update(os.path.basename(path).encode() + b"\0" + f.read())
    return "kernels-" + digest.hexdigest()[:16]


def _usable(root, path):
    """``path`` (below ``root``) made if missing; True if it is ours alone and writable.

    numba's cache files are pickles that a process loads and runs: a folder
    another user owns or may write to (a name taken first in a shared
    ``/tmp``) is refused, as ``root`` itself.
    """
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        if hasattr(os, "getuid"):
            for folder in (root, path):
                st = os.stat(folder)
                if st.st_uid != os.getuid() or st.st_mode & 0o022:
                    return False
        tempfile.TemporaryFile(dir=path).close()
        return True
    except OSError:
        return False


def _candidates(environ):
    """Cache roots to try, best first: the per-user cache, then a per-user temporary folder."""
    xdg = environ.get("XDG_CACHE_HOME", "").strip()
    if not os.path.isabs(xdg):  # the XDG spec: a relative path is invalid and ignored
        xdg = os.path.join(environ.get("HOME") or os.path.expanduser("~"), ".cache")
    uid = os.getuid() if hasattr(os, "getuid") else environ.get("USERNAME", "user")
    return [os.path.join(xdg, "ccl", "numba"),
            os.path.join(tempfile.gettempdir(), f"ccl-numba-{uid}")]


def cache_directory(environ=None):
    """Where ccl's compiled kernels are cached; None when they are not cached.

    In order:

    * ``CCL_NUMBA_CACHE=0``: None (every process compiles its kernels);
    * ``NUMBA_CACHE_DIR`` set (or numba's ``CACHE_DIR`` configured): that
      directory, as numba uses it;
    * else ``$XDG_CACHE_HOME/ccl/numba`` (``~/.cache/ccl/numba`` when
      ``XDG_CACHE_HOME`` is unset), or, where that cannot be written (a
      read-only or missing home), ``ccl-numba-<uid>`` in the temporary
      directory; None if neither can be written. A folder that another
      user owns or may write to is not used (the cache holds code that
      is loaded and run). Either way in a
      subdirectory per ccl version and source digest, so an upgraded or
      edited ccl never loads kernels compiled from other sources.

    Parameters
    ----------
    environ : mapping, optional
        The environment to read (default ``os.environ``); given, nothing
        is cached between calls.

    Returns
    -------
    str or None
    """
    if environ is None and _DIRECTORY:
        return _DIRECTORY[0]
    env = os.environ if environ is None else environ
    found = None
    if config.read("CCL_NUMBA_CACHE", env) is not False:
        explicit = env.get("NUMBA_CACHE_DIR", "").strip()
        if environ is None:  # numba's own setting too (its config file, say)
            numba.core.config.reload_config()
            explicit = explicit or numba.core.config.CACHE_DIR
        if explicit:
            found = explicit
        else:
            digest = _source_digest()
            for root in _candidates(env):
                if _usable(root, os.path.join(root, digest)):
                    found = os.path.join(root, digest)
                    _prune(root, digest)
                    break
    if environ is None:
        _DIRECTORY.append(found)
    return found


def _prune(root, current):
    """Mark ``current`` as used now; delete its siblings unused for ``_KEEP_DAYS`` days.

    Each ccl source tree gets its own directory: without this, every upgrade
    (or edit of a checkout) would leave the last one's kernels behind for good.
    A process still using a deleted directory only compiles again.
    """
    now = time.time()
    try:
        os.utime(os.path.join(root, current), (now, now))
        for name in os.listdir(root):
            path = os.path.join(root, name)
            if name.startswith("kernels-") and name != current and \
                    now - os.stat(path).st_mtime > _KEEP_DAYS * 86400:
                shutil.rmtree(path, ignore_errors=True)
    except OSError:
        pass


_KEEP_DAYS = 14


class _LockedIndex(caching.IndexDataCacheFile):
    """numba's index and data files, saved under an exclusive lock beside the index.

    Under the lock, a save reads the index, writes the data file, then the
    index that names it: concurrent savers neither lose each other's
    entries nor share a data file. Where no lock can be taken (no
    ``fcntl``; a file system that refuses it), the data file gets a name
    no other process can pick. A save that fails (a full disk, a directory
    made read-only) leaves the kernel compiled but uncached.
    """

    def file_apart(self, tag):
        """File the kernels under the function's name plus ``tag`` (nothing if empty)."""
        if tag:
            base = self._index_name[:-len(".nbi")] + "." + tag
            self._index_name = base + ".nbi"
            self._index_path = os.path.join(self._cache_path, self._index_name)
            self._data_name_pattern = base + ".{number:d}.nbc"

    def save(self, key, data):
        try:
            with _exclusive(self._index_path + ".lock") as locked:
                overloads = self._load_index()
                name = overloads.get(key)
                if name is None:
                    taken = set(overloads.values())
                    name = next(self._data_name(i) for i in range(1, len(taken) + 2)
                                if self._data_name(i) not in taken) if locked else \
                        self._data_name_pattern.replace("{number:d}", uuid.uuid4().hex[:12])
                self._save_data(name, data)
                overloads[key] = name
                self._save_index(overloads)
        except OSError:
            pass


@contextlib.contextmanager
def _exclusive(path):
    """Hold an exclusive ``flock`` on ``path``; yields whether the lock was taken."""
    try:
        import fcntl

        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except (ImportError, OSError):
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            locked = True
        except OSError:
            locked = False
        yield locked
    finally:
        os.close(fd)  # closing releases the lock


def _cached(dispatcher, directory):
    """Give ``dispatcher`` numba's on-disk cache in ``directory``, saved by ``_LockedIndex``.

    numba's locator reads ``numba.config.CACHE_DIR`` once, when the cache is
    made: it is set for that moment only, leaving numba's setting for
    everyone else's functions as it was.
    """
    with _DECORATING:
        before = numba.core.config.CACHE_DIR
        numba.core.config.CACHE_DIR = directory
        try:
            dispatcher.enable_caching()
        except RuntimeError:  # numba found no directory it can write: compile, uncached
            return dispatcher
        finally:
            numba.core.config.CACHE_DIR = before
    plain = dispatcher._cache._cache_file
    locked = _LockedIndex.__new__(_LockedIndex)
    locked.__dict__.update(plain.__dict__)
    locked.file_apart(_options_tag(dispatcher.targetoptions))
    dispatcher._cache._cache_file = locked
    return dispatcher


# options every ccl kernel has (njit's nopython, ccl's nogil): no part of the tag
_SAME_CODE = ("nopython", "nogil")


def _options_tag(options):
    """A short name for numba options that change the compiled code, e.g. ``parallel``.

    numba files a function's kernels under the function's name and keys them
    by signature and CPU only: two dispatchers of one function with other
    options (``sized_kernel``'s parallel and serial variants) would share an
    entry, and whichever compiled first would be loaded by both (the serial
    code running as the "parallel" variant, one thread where two were given).
    """
    return "-".join(name if value is True else f"{name}={value}"
                    for name, value in sorted(options.items())
                    if value is not None and name not in _SAME_CODE)


def kernels():
    """Every kernel :func:`njit` has made in this process (numba dispatchers)."""
    return list(_KERNELS)


def njit(func=None, **options):
    """``numba.njit`` with ``nogil=True``, cached in :func:`cache_directory` unless told otherwise.

    Use bare (``@njit``) or with numba options (``@njit(parallel=True)``);
    ``cache=False`` keeps one kernel out of the cache.
    """
    options.setdefault("nogil", True)
    cache = options.pop("cache", True)

    def make(f):
        dispatcher = numba.njit(**options)(f)
        directory = cache_directory() if cache else None
        if directory:
            _cached(dispatcher, directory)
        _KERNELS.append(dispatcher)
        return dispatcher

    return make if func is None else make(func)
