"""Public docstrings: numpydoc sections are present, and their examples run.

``test_numpydoc`` validates every public function and class (``ccl.__all__``,
the classes and functions of ``ccl.codecs``, ``ccl.torch.__all__``, the
errors) and the public methods of the user-facing classes with
``numpydoc.validate`` against a fixed set of rules. ``test_examples`` runs
each public module's docstring examples in that module's namespace; it is
an MPI test, so the examples run at every rank count of ``make test`` (they
are written to hold at any size, and every rank runs them in the same order,
so their collectives match).
"""

import doctest
import importlib
import inspect
import pathlib

import pytest
from mpi4py import MPI

import ccl
import ccl.codecs
import ccl.testing

# numpydoc.validate codes enforced (the rest, e.g. "See Also" or extended summaries, are
# style choices left to review):
ALWAYS = {
    "GL08",  # the object has a docstring
    "SS01",  # ... starting with a one-line summary
    "PR01",  # every parameter is documented
    "PR02",  # no documented parameter that does not exist
    "PR07",  # every documented parameter has a description
    "RT01",  # a Returns section where the function returns something
}
# functions and classes (not every method) also show an example
WITH_EXAMPLE = ALWAYS | {"EX01"}

TORCH_MODULES = ["ccl.torch.runtime", "ccl.torch.functions", "ccl.torch.buckets", "ccl.torch.ddp",
                 "ccl.torch.optimizer", "ccl.torch.adam", "ccl.torch.compression",
                 "ccl.torch.collectives", "ccl.torch.autograd", "ccl.torch.handles",
                 "ccl.torch.movement", "ccl.torch.autograd_movement", "ccl.torch.adasum",
                 "ccl.torch.sync_batch_norm", "ccl.torch.horovod_env", "ccl.torch.timeline",
                 "ccl.torch.process_sets", "ccl.torch.basics", "ccl.torch.horovod_optimizer",
                 "ccl.torch.horovod_functions", "ccl.torch.tensor_ops", "ccl.torch.diloco",
                 "ccl.torch.joins", "ccl.torch.diloco_plan", "ccl.torch.adasum_optimizer",
                 "ccl.torch.checkpoint", "ccl.torch.matching"]
#: Public modules that must show docstring examples.
EXAMPLE_MODULES = [
    "ccl", "ccl.api", "ccl.errors", "ccl.feedback", "ccl.launch",
    "ccl.codecs.base", "ccl.codecs.configurable", "ccl.codecs.framing", "ccl.codecs.header",
    "ccl.codecs.context", "ccl.codecs.registry",
    "ccl.codecs.casts.codec", "ccl.codecs.threelc.codec", "ccl.codecs.thc.codec",
    "ccl.codecs.sparse.topk", "ccl.codecs.sparse.sidco", "ccl.codecs.randomk.codec",
    "ccl.codecs.onebit.codec", "ccl.codecs.dithering.codec", "ccl.codecs.sparse.sparseloco",
    "ccl.collectives.auto", "ccl.trace", "ccl.run",
    "ccl.testing",
] + TORCH_MODULES
#: Modules whose import raises on purpose (Horovod's elastic training is not supported).
UNIMPORTABLE = {"ccl.torch.elastic"}


def _modules_with_examples():
    """Every ccl module whose source holds a docstring example, so no example goes unrun."""
    root = pathlib.Path(ccl.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        if ">>> " in path.read_text(encoding="utf-8"):
            parts = path.relative_to(root.parent).with_suffix("").parts
            found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


DOCTEST_MODULES = sorted((set(EXAMPLE_MODULES) | set(_modules_with_examples())) - UNIMPORTABLE)


def _qualified(obj):
    return f"{obj.__module__}.{obj.__qualname__}"


def _public_methods(cls, names=None):
    """Public methods and properties defined by ``cls`` itself (not inherited)."""
    for name, attr in vars(cls).items():
        if name.startswith("_") or (names is not None and name not in names):
            continue
        if inspect.isfunction(attr) or isinstance(attr, (property, classmethod, staticmethod)):
            yield f"{_qualified(cls)}.{name}"


def _public_ccl_bases(cls):
    """The public classes of ccl that ``cls`` inherits from (their methods are ``cls``'s too)."""
    return [base for base in cls.__mro__[1:]
            if base.__module__.partition(".")[0] == "ccl" and not base.__name__.startswith("_")]


def public_objects():
    """``(qualified name, rules)`` of every object whose docstring the rules cover."""
    objects = {}
    namespaces = [(ccl, ccl.__all__), (ccl.codecs, ccl.codecs.__all__)]
    namespaces.append((ccl.testing, ccl.testing.__all__))
    try:
        import ccl.torch as ct
        namespaces.append((ct, ct.__all__))
    except ImportError:
        pass
    for module, names in namespaces:
        for name in names:
            obj = getattr(module, name)
            if not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue  # constants and submodules
            objects[_qualified(obj)] = WITH_EXAMPLE
            if inspect.isclass(obj) and not issubclass(obj, BaseException):
                for method in _public_methods(obj):
                    objects[method] = ALWAYS
                for base in _public_ccl_bases(obj):  # Codec's methods, from its mixins
                    for method in _public_methods(base):
                        objects[method] = ALWAYS
    if "ccl.torch" in str(namespaces):
        from ccl.torch.optimizer import _DistributedMixin
        for method in _public_methods(_DistributedMixin):  # what the wrapper adds
            objects[method] = ALWAYS
    return sorted(objects.items())


@pytest.mark.serial
def test_numpydoc():
    validate = pytest.importorskip("numpydoc.validate", reason="needs numpydoc (the docs "
                                   "extra: pip install '.[docs]')").validate
    problems = []
    for name, rules in public_objects():
        for code, message in validate(name)["errors"]:
            if code in rules:
                problems.append(f"{name}: {code} {message}")
    assert not problems, "docstrings break the numpydoc rules:\n" + "\n".join(problems)


@pytest.mark.serial
def test_rules_can_fail():
    """The validation catches a docstring without parameters, returns or example."""
    validate = pytest.importorskip("numpydoc.validate").validate
    codes = {code for code, _ in validate(f"{__name__}._undocumented")["errors"]}
    assert {"PR01", "RT01", "EX01"} <= codes


def _undocumented(x):
    """Return ``x``."""
    return x


@pytest.mark.mpi
@pytest.mark.parametrize("module_name", DOCTEST_MODULES)
def test_examples(module_name):
    if module_name.startswith("ccl.torch"):
        pytest.importorskip("torch")
        import ccl.torch as ct
        was_initialized = ct.is_initialized()
    module = importlib.import_module(module_name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    tests = [t for t in doctest.DocTestFinder().find(module, module_name) if t.examples]
    report = []
    try:
        for test in tests:
            result = runner.run(test, out=report.append)
            assert result.failed == 0, f"{test.name} (rank {MPI.COMM_WORLD.rank}):\n" + \
                "".join(report)
    finally:
        if module_name.startswith("ccl.torch") and not was_initialized and ct.is_initialized():
            ct.shutdown()  # the examples initialised ccl.torch; later tests start clean
    if module_name in EXAMPLE_MODULES and module_name not in ("ccl.feedback",
                                                              "ccl.collectives.auto"):
        assert tests, f"{module_name} has no docstring examples"
