"""Codec capabilities: every built-in codec states them, and ccl reads them, not codec ids."""

import ast
import pathlib
import re

import numpy as np
import pytest

from ccl.codecs import Codec, get_codec, registered_codecs
from ccl.collectives import auto

CAPABILITIES = ("bits_per_value", "encode_gbps", "decode_gbps", "shared_statistics",
                "identity", "error_feedback", "homomorphic", "sparse")
BUILT_IN = [c for c in registered_codecs() if not c.startswith("test")]


def _declared(cls, name):
    """Whether a class below Codec in ``cls``'s hierarchy sets ``name``."""
    return any(name in vars(k) for k in cls.__mro__ if k is not Codec and issubclass(k, Codec))


@pytest.mark.parametrize("codec_id", BUILT_IN)
def test_every_built_in_codec_states_its_figures(codec_id):
    codec = get_codec(codec_id)
    for name in ("encode_gbps", "decode_gbps"):
        assert _declared(type(codec), name), f"{codec_id} does not state {name}"
        assert getattr(codec, name) > 0
    if not codec.identity:
        assert _declared(type(codec), "bits_per_value"), f"{codec_id} states no bits_per_value"
    assert 0 < codec.bits_per_value <= 32
    for name in CAPABILITIES:
        assert isinstance(getattr(codec, name), (bool, float, int)), name


def test_bits_per_value_follows_the_configuration():
    assert get_codec("thc", bits=2).bits_per_value < get_codec("thc", bits=4).bits_per_value
    assert get_codec("topk", density=0.001).bits_per_value < \
        get_codec("topk", density=0.01).bits_per_value
    assert get_codec("none").identity and not get_codec("fp16").identity
    assert get_codec("thc").shared_statistics and not get_codec("3lc").shared_statistics


class _UserCodec(Codec):
    """A codec as a user would write it: no capabilities stated."""

    codec_id, wire_id = "user-example", 201

    def _encode(self, x, ctx):
        return x.astype(np.float32).view(np.uint8), 0

    def _decode(self, header, body, ctx):
        return body.view(np.float32).copy()


class _UserCodecWithFigures(_UserCodec):
    """A half-precision codec stating what it sends and how fast it is (auto's model
    measures the bits it really sends, and takes the stated speeds)."""

    codec_id, wire_id = "user-example-half", 202
    bits_per_value = 16.0
    encode_gbps = decode_gbps = 20.0

    def _encode(self, x, ctx):
        return x.astype(np.float16).view(np.uint8), 0

    def _decode(self, header, body, ctx):
        return body.view(np.float16).astype(np.float32)


def test_a_user_codec_gets_safe_defaults_and_can_state_its_own():
    plain, stated = _UserCodec(), _UserCodecWithFigures()
    assert plain.bits_per_value == 32.0 and not plain.identity
    assert not plain.shared_statistics and plain.error_feedback
    n = 64 << 20
    # the defaults assume nothing is saved: auto never compresses with them ...
    assert auto.choose(plain, n, 4, np.float32, link_gbps=1.0) == "mpi"
    # ... while the stated figures make compression pay on a slow link
    assert auto.choose(stated, n, 4, np.float32, link_gbps=1.0) == "direct"


def test_no_module_outside_the_codecs_compares_codec_ids():
    import os
    import re
    root = os.path.join(os.path.dirname(__file__), "..", "ccl")
    pattern = re.compile(r"(?<!for )\bcodec_id\s*(==|!=|in\b)|\bcid\s*==")
    found = []
    for folder in ("", "collectives", "torch"):
        for name in sorted(os.listdir(os.path.join(root, folder))):
            if name.endswith(".py"):
                with open(os.path.join(root, folder, name), encoding="utf-8") as f:
                    found += [f"{folder}/{name}: {line.strip()}" for line in f
                              if pattern.search(line)]
    assert found == []


# An operand that holds a codec id: ``codec.codec_id``, ``cid``, ``config["id"]``, ...
_HOLDS_AN_ID = re.compile(r"codec|\bc?id\b")


def _literal_ids(node, ids):
    """The codec ids among the string constants of ``node`` (a constant or a tuple/list/set)."""
    elements = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return {e.value for e in elements if isinstance(e, ast.Constant) and e.value in ids}


def id_comparisons(source, ids):
    """Lines of ``source`` that compare something holding a codec id with one of ``ids``.

    ``==``, ``!=``, ``in`` and ``not in`` against a literal id (or a
    collection of them); a comparison with a string that is no codec's id
    (a DDP hook's name, ``"MPI_Allreduce"``) is not one.
    """
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for a, b in zip(operands, operands[1:]):
            for literal, other in ((a, b), (b, a)):
                if _literal_ids(literal, ids) and _HOLDS_AN_ID.search(ast.unparse(other)):
                    found.append(node.lineno)
    return sorted(set(found))


def test_the_id_comparison_check_finds_them():
    ids = {"none", "fp16", "sidco"}
    source = ("a = codec.codec_id == 'none'\n"
              "b = 'sidco' != config['id']\n"
              "c = cid in ('fp16', 'bf16')\n"
              "d = hook == 'fp16'\n"                  # a DDP hook, not a codec
              "e = row['codec'] == 'MPI_Allreduce'\n"  # not a codec id
              "f = codec.identity\n")
    assert id_comparisons(source, ids) == [1, 2, 3]


def test_no_module_outside_the_codec_families_compares_with_a_codec_id():
    """Outside ``ccl/codecs/`` every module reads capabilities, never a codec's id."""
    root = pathlib.Path(__file__).resolve().parent.parent / "ccl"
    ids = set(registered_codecs())
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).parts[0] == "codecs":
            continue
        found += [f"{path.relative_to(root.parent)}:{line}"
                  for line in id_comparisons(path.read_text(encoding="utf-8"), ids)]
    assert found == [], "compare capabilities (identity, sparse, homomorphic, ...) " \
        "instead of codec ids: " + ", ".join(found)
