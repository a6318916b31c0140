"""Golden wire-format payloads: what each format version wrote, decoded by every later version.

As numcodecs' ``check_backwards_compatibility``: payloads written once, by
the version of ccl that introduced a format version (or a codec, or a
configuration), are stored in ``mpi_tests/golden/v<FORMAT_VERSION>/`` with
the values they decoded to then. ``mpi_tests/test_golden.py`` decodes every
stored payload with today's code and compares the result bit for bit: a
decoder change that would misread data (or a checkpoint) written by an
earlier version fails there.

``python -m mpi_tests.golden`` writes the files of the current format version
that are missing (a new format version, codec or configuration) and never
overwrites a stored file: those record what was sent, not what today's code
sends. One file per codec configuration and input dtype (every registered
codec's defaults, and :data:`ccl.tools.VARIANTS`, the configurations whose body
layout differs), each holding a plain payload of :data:`SIZE` normal values,
one of an input with a NaN (flagged) and, for homomorphic codecs, the sum of
three encodings (more contributors, wider lanes).
"""

import base64
import json
import pathlib

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
#: Values per payload: a few hundred, not a multiple of any codec's block or word.
SIZE = 203
SEED = 20290
#: The context every golden payload is encoded and decoded in (seeds derive from it).
CONTEXT = {"step": 3, "key": "golden", "chunk": 1}


def version_dir(version, root=HERE):
    """The folder of format version ``version``'s golden files."""
    return pathlib.Path(root) / f"v{version}"


def case_name(config, dtype):
    """File stem of one case: ``thc-bits=3-block=64-...-float32`` (parameters sorted)."""
    params = [f"{k}={config[k]}" for k in sorted(config) if k != "id"]
    return "-".join([config["id"], *params, np.dtype(dtype).name])


def cases():
    """``{name: (config, dtype)}``: every built-in codec's defaults and each wire variant."""
    from ccl.codecs import get_codec, registered_codecs
    from ccl.tools import VARIANTS

    found = {}
    for spec in [{"id": cid} for cid in registered_codecs()] + list(VARIANTS):
        codec = get_codec(spec)
        if not type(codec).__module__.startswith("ccl."):
            continue  # a codec a test registered, not one of ccl's
        dtypes = codec.input_dtypes if spec == {"id": spec["id"]} else (np.dtype(np.float32),)
        for dtype in dtypes:
            found[case_name(spec, dtype)] = (spec, np.dtype(dtype))
    return found


def _b64(array):
    return base64.b64encode(np.ascontiguousarray(array).view(np.uint8).tobytes()).decode()


def _unb64(text, dtype):
    return np.frombuffer(base64.b64decode(text), dtype=np.uint8).view(dtype)


def _context(entry):
    from ccl.codecs import CodecContext

    shared = entry.get("shared")
    if shared is not None:
        shared = np.array(shared["values"], dtype=shared["dtype"])
    return CodecContext(**entry["context"], shared=shared, n=entry["n"])


def _entries(codec, dtype):
    """The payloads of one case: ``[(what, payload, context dict, shared or None)]``."""
    from ccl.codecs import CodecContext

    rng = np.random.default_rng([SEED, codec.wire_id])
    inputs = [rng.standard_normal(SIZE).astype(dtype) for _ in range(3)]
    nan = inputs[0].copy()
    nan[7] = np.nan
    context = dict(CONTEXT)
    shared = None
    if codec.shared_statistics:  # ranks agree on them (MAX) before they encode
        shared = np.maximum.reduce([np.asarray(codec.shared_stats(x)) for x in inputs])
    ctx = CodecContext(**context, shared=shared, n=SIZE)
    entries = [("plain", codec.encode(inputs[0], ctx), context, shared),
               ("nonfinite", codec.encode(nan, ctx), context, shared)]
    if codec.homomorphic:
        payloads = [codec.encode(x, CodecContext(**context, rank=r, shared=shared, n=SIZE))
                    for r, x in enumerate(inputs)]
        total = codec.add(codec.add(payloads[0], payloads[1], ctx), payloads[2], ctx)
        entries.append(("sum of 3", total, context, shared))
    return entries


def make_case(config, dtype):
    """The JSON document of one case, encoded and decoded by this version of ccl."""
    import ccl
    from ccl.codecs import get_codec

    codec = get_codec(config)
    document = {"ccl": ccl.__version__, "config": codec.get_config(),
                "dtype": np.dtype(dtype).name, "entries": []}
    for what, payload, context, shared in _entries(codec, dtype):
        entry = {"what": what, "context": context, "n": SIZE,
                 "shared": None if shared is None else {"dtype": shared.dtype.name,
                                                        "values": shared.tolist()},
                 "payload": _b64(payload)}
        decoded = codec.decode(payload, _context(entry))
        entry.update(decoded_dtype=decoded.dtype.name, decoded=_b64(decoded))
        document["entries"].append(entry)
    return document


def check_file(path):
    """Decode every payload of one golden file; ``AssertionError`` names the first difference.

    Raises ``ccl.PayloadError`` where today's decoder refuses a stored payload.
    """
    from ccl.codecs import get_codec

    document = json.loads(pathlib.Path(path).read_text())
    codec = get_codec(document["config"])
    for entry in document["entries"]:
        payload = _unb64(entry["payload"], np.uint8)
        expected = _unb64(entry["decoded"], entry["decoded_dtype"])
        got = codec.decode(payload, _context(entry))
        where = f"{pathlib.Path(path).name}, {entry['what']}"
        assert got.dtype == expected.dtype, f"{where}: decodes to {got.dtype}, was {expected.dtype}"
        assert got.shape == expected.shape, f"{where}: decodes to {got.shape}, was {expected.shape}"
        # bit for bit, NaNs included: the same bytes must mean the same values
        differ = np.flatnonzero(got.view(np.uint8) != expected.view(np.uint8)) // got.itemsize
        assert differ.size == 0, (f"{where}: {np.unique(differ).size} values decode "
                                  f"differently, the first at index {differ[0]}")


def stored_files(root=HERE):
    """Every golden file of every format version, sorted."""
    return sorted(pathlib.Path(root).glob("v*/*.json"))


def write(root=HERE):
    """Write the missing files of today's format version; return their paths.

    A stored file is never overwritten: it records what an earlier version sent.
    """
    from ccl.codecs.header import FORMAT_VERSION

    folder = version_dir(FORMAT_VERSION, root)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (config, dtype) in sorted(cases().items()):
        path = folder / f"{name}.json"
        if path.exists():
            continue
        text = json.dumps(make_case(config, dtype), indent=1, sort_keys=True) + "\n"
        with open(path, "x") as f:  # "x": fails rather than replace a file
            f.write(text)
        written.append(path)
    return written
