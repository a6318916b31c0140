"""Layering of ``ccl/``, read from the source: no import cycle, no reach into private names.

The checks parse every module with :mod:`ast` instead of importing it, so
they see imports inside functions (lazy imports) as well as module-level
ones, and run without numba.cuda, cupy or torch.

* **Import cycles.** A module imports every ``ccl`` module named by an
  ``import`` or ``from ... import`` statement anywhere in its source; the
  parent packages a dotted import also runs are not counted (every module
  would otherwise depend on ``ccl/__init__.py``). No cycle is allowed.
* **Private names.** A module does not use another module's ``_name``:
  neither ``from module import _name`` nor ``module._name`` through an
  imported module. Modules themselves are not names (``from . import
  _kernels`` is fine), and the modules of one codec family, a subpackage
  ``ccl/codecs/<family>/``, may share their private names.
* **Private modules of a codec family.** A family's private modules
  (``ccl/codecs/threelc/_kernels.py``, ``_cuda.py``, ``_tables.py``, ...)
  are imported by that family alone: another family, the framework at the
  top of ``ccl/codecs`` and the rest of ``ccl`` use the family's public
  modules. (The device dispatch loads a twin from the string a codec class
  names, not by an import.)
* **Module size.** No module is longer than ``MAX_MODULE_LINES``: past
  that, a module holds several things and each wants its own place.
"""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
CODECS = "ccl.codecs"

# Private reaches outside the codec families that other work in progress removes:
# (module, the module it reaches into, name). Delete an entry once its reach is gone
# (test_known_exceptions_still_occur says when).
KNOWN_PRIVATE_REACHES = set()

MAX_MODULE_LINES = 500
# Modules allowed to be longer, each with the reason. Delete an entry once its module is
# short enough (test_long_modules_are_still_long says when). Generated tables, should one
# outgrow the limit, belong here too, not split by hand.
LONG_MODULES = {}


def _module_paths():
    """``{dotted name: path}`` of every module under ``ccl/`` (packages by their __init__)."""
    modules = {}
    for path in sorted((ROOT / "ccl").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


MODULES = _module_paths()
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def _is_package(module):
    path = MODULES.get(module)
    return path is not None and path.name == "__init__.py"


def _package_of(module):
    return module if _is_package(module) else module.rpartition(".")[0]


def _source_of(module, node):
    """The absolute name of the module a ``from ... import`` statement reads from."""
    if node.level == 0:
        return node.module
    package = _package_of(module)
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _bindings(module, tree):
    """What each import statement of ``module`` does, one entry per imported name.

    Entries are ``(loaded, bound, bound_module, source, name)``: the ``ccl``
    module the statement loads for this name (or None), the local name it
    binds, the ``ccl`` module that local name refers to (or None), and for
    ``from source import name`` the source module and the name.
    """
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                loaded = alias.name if alias.name in MODULES else None
                if alias.asname:
                    yield loaded, alias.asname, loaded, None, None
                else:  # "import a.b.c" binds "a"
                    head = alias.name.partition(".")[0]
                    yield loaded, head, head if head in MODULES else None, None, None
        elif isinstance(node, ast.ImportFrom):
            source = _source_of(module, node)
            for alias in node.names:
                full = f"{source}.{alias.name}"
                submodule = full if full in MODULES else None
                # "from m import name" runs m (a submodule "from pkg import mod" runs mod)
                loaded = submodule or (source if source in MODULES else None)
                yield loaded, alias.asname or alias.name, submodule, source, alias.name


def import_graph():
    """``{module: set of ccl modules its source imports}``, lazy imports included."""
    return {module: {loaded for loaded, *_ in _bindings(module, TREES[module])
                     if loaded is not None and loaded != module}
            for module in MODULES}


def import_cycles(graph):
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


def _family(module):
    """The codec family of a module: the subpackage of ``ccl/codecs`` it is in (or None)."""
    if not module.startswith(CODECS + "."):
        return None
    family = module[len(CODECS) + 1:].partition(".")[0]
    return family if _is_package(f"{CODECS}.{family}") else None


def families():
    """The codec families: the subpackages of ``ccl/codecs``."""
    return sorted({_family(module) for module in MODULES} - {None})


def _private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _allowed(module, owner):
    family = _family(module)
    return owner == module or (family is not None and family == _family(owner))


def _family_private(module):
    """Whether ``module`` is a private module of a codec family (``ccl.codecs.thc._tables``)."""
    if _family(module) is None:
        return False
    return any(_private(part) for part in module.split(".")[3:])


def _attribute_chain(node):
    """``("a", ["b", "c"])`` for the expression ``a.b.c``; None if it does not start at a name."""
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    return (node.id, attrs[::-1]) if isinstance(node, ast.Name) else None


def private_reaches(module, tree, allowed=_allowed):
    """``{(module, owner, name)}``: each use of a private name of another module ``owner``.

    ``tree`` is the module's parsed source; ``allowed(module, owner)`` says when ``module``
    may use the private names of ``owner`` (by default: within one codec family).
    """
    found = set()
    aliases = {}
    for _, bound, bound_module, source, name in _bindings(module, tree):
        if bound_module is not None:
            aliases[bound] = bound_module
        elif source in MODULES and _private(name) and not allowed(module, source):
            found.add((module, source, name))
    inner = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or id(node) in inner:
            continue  # the outermost attribute of a chain walks the inner ones
        chain = _attribute_chain(node)
        if chain is None or chain[0] not in aliases:
            continue
        owner = aliases[chain[0]]
        for attr in chain[1]:
            if f"{owner}.{attr}" in MODULES:
                owner = f"{owner}.{attr}"
                continue
            if _private(attr) and not allowed(module, owner):
                found.add((module, owner, attr))
            break
    return found


def all_private_reaches(allowed=_allowed):
    found = set()
    for module in MODULES:
        found |= private_reaches(module, TREES[module], allowed)
    return found


def family_private_imports(module, tree):
    """``{(module, imported)}``: each private module of another codec family that ``module``
    imports, by an import statement or through the attributes of an imported package.

    ``tree`` is the module's parsed source.
    """
    found = set()
    aliases = {}
    for loaded, bound, bound_module, _, _ in _bindings(module, tree):
        if loaded is not None and _family_private(loaded) and not _allowed(module, loaded):
            found.add((module, loaded))
        if bound_module is not None:
            aliases[bound] = bound_module
    for node in ast.walk(tree):  # "import ccl.codecs.thc" then "ccl.codecs.thc._tables.x"
        chain = _attribute_chain(node) if isinstance(node, ast.Attribute) else None
        if chain is None or chain[0] not in aliases:
            continue
        owner = aliases[chain[0]]
        for attr in chain[1]:
            if f"{owner}.{attr}" not in MODULES:
                break
            owner = f"{owner}.{attr}"
            if _family_private(owner) and not _allowed(module, owner):
                found.add((module, owner))
    return found


def stale_entries(known, found):
    """The entries of an exception list ``known`` that ``found`` no longer holds, sorted."""
    return sorted(set(known) - set(found))


def long_modules(sources, limit=MAX_MODULE_LINES):
    """``{module: line count}`` of the modules in ``{module: source}`` over ``limit`` lines."""
    counts = {module: len(text.splitlines()) for module, text in sources.items()}
    return {module: n for module, n in counts.items() if n > limit}


def _long_modules_of_ccl():
    return long_modules({module: path.read_text() for module, path in MODULES.items()})


def test_the_checks_see_what_they_look_for():
    """The scanners on a small made-up package: they must find what they are meant to."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert _family("ccl.codecs.threelc._cuda") == _family("ccl.codecs.threelc") == "threelc"
    assert _family("ccl.codecs.thc._tables") == "thc" != _family("ccl.codecs.threelc.codec")
    assert _family("ccl.api") is None and _family("ccl.codecs._cuda_common") is None
    assert _allowed("ccl.codecs.threelc._cuda", "ccl.codecs.threelc._kernels")
    assert not _allowed("ccl.codecs.thc._cuda", "ccl.codecs.threelc._kernels")
    assert not _allowed("ccl.api", "ccl.transport")
    assert _family_private("ccl.codecs.sparse._common")
    assert not _family_private("ccl.codecs.sparse.sidco")
    assert not _family_private("ccl.codecs._shared_kernels")  # the framework's, shared
    source = (
        "from ..threelc import codec\n"
        "from ..threelc.codec import _BODY_HEADER, quartic_len\n"
        "from . import _kernels as k\n"
        "from ..threelc import _kernels\n"
        "def f():\n"
        "    import ccl.codecs.onebit.codec\n"
        "    return (codec._ABS_MASKS, ccl.codecs.onebit.codec._bit(1, 2), k._mix, codec.K,\n"
        "            k.__name__, _kernels.ZERO_BYTE)\n")
    module = "ccl.codecs.thc._cuda"
    loaded = {name for name, *_ in _bindings(module, ast.parse(source))}
    assert {"ccl.codecs.threelc.codec", "ccl.codecs.threelc._kernels",
            "ccl.codecs.onebit.codec"} <= loaded  # the import inside f() counts too
    found = private_reaches(module, ast.parse(source))
    assert found == {(module, "ccl.codecs.threelc.codec", "_BODY_HEADER"),
                     (module, "ccl.codecs.threelc.codec", "_ABS_MASKS"),
                     (module, "ccl.codecs.onebit.codec", "_bit")}
    at_limit, over = "x = 1\n" * MAX_MODULE_LINES, "x = 1\n" * (MAX_MODULE_LINES + 1)
    assert long_modules({"ccl.a": at_limit, "ccl.b": over, "ccl.c": ""}) == \
        {"ccl.b": MAX_MODULE_LINES + 1}


def test_the_family_check_sees_a_reach_into_another_family():
    """The private-module scanner on made-up modules: each way in is found, its own are not."""
    module = "ccl.codecs.thc._cuda"
    source = (
        "from . import _kernels, _tables\n"                  # its own family: fine
        "from ..threelc import codec, _kernels as k3\n"      # the public module is fine
        "from ..sparse._common import SparseCodec\n"
        "import ccl.codecs.onebit._cuda as twin\n"
        "def f():\n"
        "    import ccl.codecs.dithering\n"
        "    return ccl.codecs.dithering._cuda.DitheringTwin, ccl.codecs.dithering.codec\n")
    assert family_private_imports(module, ast.parse(source)) == {
        (module, "ccl.codecs.threelc._kernels"), (module, "ccl.codecs.sparse._common"),
        (module, "ccl.codecs.onebit._cuda"), (module, "ccl.codecs.dithering._cuda")}
    # outside the codec families too: the framework and the rest of ccl
    outside = "from .codecs.thc import _tables\nfrom .codecs.thc import THCCodec\n"
    assert family_private_imports("ccl.api", ast.parse(outside)) == {
        ("ccl.api", "ccl.codecs.thc._tables")}
    assert family_private_imports("ccl.codecs.device", ast.parse(
        "from .casts._cuda import NoneTwin\n")) == {
        ("ccl.codecs.device", "ccl.codecs.casts._cuda")}


def test_codec_families_are_the_subpackages():
    """Every codec lives in a family subpackage; the top of ``ccl/codecs`` is the framework."""
    assert families() == ["casts", "dithering", "onebit", "randomk", "sparse", "thc", "threelc"]
    top = {module.rpartition(".")[2] for module in MODULES
           if module.startswith(CODECS + ".") and _family(module) is None}
    assert top == {"base", "configurable", "context", "device", "framing", "header",
                   "registry", "_cuda_common", "_shared_kernels"}


def test_no_codec_family_imports_another_familys_private_modules():
    """A family's private modules are imported by that family alone (lazy imports included)."""
    found = set()
    for module in MODULES:
        found |= family_private_imports(module, TREES[module])
    assert not found, "private modules of a codec family imported from outside it (use " \
        "the family's public modules): " + ", ".join(f"{m} imports {o}" for m, o in sorted(found))


def device_twins():
    """``(module, class, spec)`` of each ``device_twin = "..."`` in a class body of ``ccl/``."""
    for module, tree in TREES.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant) \
                        and isinstance(stmt.value.value, str) \
                        and any(getattr(t, "id", None) == "device_twin" for t in stmt.targets):
                    yield module, node.name, stmt.value.value


def test_device_twins_live_in_their_family_and_load_lazily():
    """Each codec names a twin class of its own family's ``_cuda`` module, and only the twins
    import the twins' modules: a CPU-only run never loads numba.cuda."""
    twins = sorted(device_twins())
    assert {_family(module) for module, _, _ in twins} == set(families())
    for module, cls, spec in twins:
        twin_module, _, name = spec.partition(":")
        assert twin_module == f"{CODECS}.{_family(module)}._cuda", (module, cls, spec)
        defined = {n.name for n in TREES[twin_module].body if isinstance(n, ast.ClassDef)}
        assert name in defined, f"{module}.{cls}: no class {name} in {twin_module}"
    cuda_modules = {f"{CODECS}._cuda_common"} | {f"{CODECS}.{f}._cuda" for f in families()}
    importers = {module for module, imported in import_graph().items()
                 if imported & cuda_modules}
    assert importers <= cuda_modules, \
        f"import a device twin's module: {sorted(importers - cuda_modules)}"


def test_no_import_cycle():
    """No cycle in the import graph of ``ccl/``, counting imports inside functions."""
    cycles = import_cycles(import_graph())
    assert not cycles, "import cycles (each a set of modules importing each other): " + \
        "; ".join(" <-> ".join(c) for c in cycles)


def test_no_private_names_across_modules():
    """No module uses another module's ``_name``, except within one codec family."""
    found = all_private_reaches() - KNOWN_PRIVATE_REACHES
    assert not found, "private names used across modules (make them public, or move the " \
        "code into the owner's family): " + \
        ", ".join(f"{m} uses {o}.{n}" for m, o, n in sorted(found))


def test_known_exceptions_still_occur():
    """Every entry of KNOWN_PRIVATE_REACHES still occurs (delete those that were fixed)."""
    found = all_private_reaches()
    stale = stale_entries(KNOWN_PRIVATE_REACHES, found)
    assert not stale, f"fixed, remove from KNOWN_PRIVATE_REACHES: {stale}"
    # The check on ccl's own reaches: the private names the codec families share (the
    # reaches the family rule allows) are listed, with one that no longer occurs; only
    # that one is stale.
    shared = all_private_reaches(allowed=lambda module, owner: module == owner) - found
    assert shared, "the codec families share no private name: the check reads nothing"
    fixed = ("ccl.api", "ccl.codecs.base", "_no_longer_used")
    assert stale_entries(shared | {fixed}, found | shared) == [fixed]


def test_no_module_is_too_long():
    """Every module under ``ccl/`` has at most ``MAX_MODULE_LINES`` lines (LONG_MODULES aside)."""
    found = {m: n for m, n in _long_modules_of_ccl().items() if m not in LONG_MODULES}
    assert not found, f"modules over {MAX_MODULE_LINES} lines (split them along their " \
        "seams): " + ", ".join(f"{MODULES[m].relative_to(ROOT)} ({n})"
                               for m, n in sorted(found.items()))


def test_long_modules_are_still_long():
    """Every entry of LONG_MODULES is still over the limit (delete those that were split)."""
    stale = stale_entries(LONG_MODULES, _long_modules_of_ccl())
    assert not stale, f"short enough now, remove from LONG_MODULES: {stale}"
    # The check on ccl's own modules: at a limit just below the longest module, listing it
    # and the shortest one leaves the shortest stale.
    lengths = {module: len(path.read_text().splitlines()) for module, path in MODULES.items()}
    longest, shortest = max(lengths, key=lengths.get), min(lengths, key=lengths.get)
    over = long_modules({m: MODULES[m].read_text() for m in (longest, shortest)},
                        limit=lengths[longest] - 1)
    assert stale_entries({longest: "long", shortest: "short"}, over) == [shortest]


# The transport moves bytes between ranks: it sits below the collectives and everything built
# on them, and knows nothing of codecs, algorithms, error feedback, threads or torch.
TRANSPORT = "ccl.transport"
ABOVE_TRANSPORT = ("ccl.collectives", "ccl.codecs", "ccl.feedback", "ccl.threads", "ccl.torch",
                   "ccl.bench", "ccl.api", "ccl.communicator")


def _within(module, package):
    return module == package or module.startswith(package + ".")


def imports_above(graph, package, above):
    """``{(module, imported)}``: a module of ``package`` importing one of the packages ``above``."""
    return {(module, dep) for module, deps in graph.items() if _within(module, package)
            for dep in deps if any(_within(dep, a) for a in above)}


def test_the_transport_imports_nothing_above_it():
    made_up = {"p": {"p.a"}, "p.a": {"q.b", "r"}, "q.b": {"p.a"}, "pq": {"q"}}
    assert imports_above(made_up, "p", ("q",)) == {("p.a", "q.b")}
    found = imports_above(import_graph(), TRANSPORT, ABOVE_TRANSPORT)
    assert not found, "the transport imports modules above it: " + \
        ", ".join(f"{m} imports {d}" for m, d in sorted(found))
