"""One signature family: the array (and a function's codec) positional, the rest by keyword.

``Communicator.allreduce(x, "fp16")`` once ran uncompressed under a key named
"fp16". Every entry point now takes only the array (and, for the functions,
the codec) positionally, and an extra positional argument raises a
``TypeError`` that names the call to write.
"""

import inspect

import numpy as np
import pytest
from mpi4py import MPI

import ccl
from ccl.collectives import Options

FUNCTIONS = {"compressed_allreduce": ccl.compressed_allreduce,
             "reduce_scatter": ccl.reduce_scatter, "allgather": ccl.allgather}
METHODS = ("allreduce", "reduce_scatter", "allgather")


def _keyword_only_after(func, positional):
    params = list(inspect.signature(func).parameters.values())
    assert all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params[:positional])
    return all(p.kind is p.KEYWORD_ONLY for p in params[positional:])


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_functions_take_array_and_codec_positionally(name):
    assert _keyword_only_after(FUNCTIONS[name], 2)


@pytest.mark.parametrize("name", METHODS)
def test_methods_take_only_the_array_positionally(name):
    assert _keyword_only_after(getattr(ccl.Communicator, name), 2)  # self, x
    assert "timeout" in inspect.signature(getattr(ccl.Communicator, name)).parameters


def test_communicator_takes_comm_and_codec_positionally():
    assert _keyword_only_after(ccl.Communicator.__init__, 3)  # self, comm, codec


@pytest.mark.parametrize("call, right", [
    (lambda c, x: c.allreduce(x, "fp16"), "c.allreduce(x, codec='fp16')"),
    (lambda c, x: c.allreduce(x, "layer1.weight"), "c.allreduce(x, key='layer1.weight')"),
    (lambda c, x: c.allreduce(x, "w", "mean"), "c.allreduce(x, key='w', op='mean')"),
    (lambda c, x: c.reduce_scatter(x, {"id": "3lc"}), "c.reduce_scatter(x, codec={'id': '3lc'})"),
    (lambda c, x: c.allgather(x, "w"), "c.allgather(block, key='w')"),
    (lambda c, x: ccl.compressed_allreduce(x, "fp16", "mean"),
     "ccl.compressed_allreduce(x, codec, op='mean')"),
    (lambda c, x: ccl.compressed_allreduce(x, "fp16", MPI.COMM_WORLD, "sum", "ring"),
     "ccl.compressed_allreduce(x, codec, comm=<Intracomm>, op='sum', algorithm='ring')"),
    (lambda c, x: ccl.reduce_scatter(x, "fp16", None, "mean"),
     "ccl.reduce_scatter(x, codec, comm=None, op='mean')"),
    (lambda c, x: ccl.allgather(x, "fp16", None, "w"),
     "ccl.allgather(block, codec, comm=None, key='w')"),
    (lambda c, x: ccl.Communicator(None, "fp16", "ring"),
     "ccl.Communicator(comm, codec, algorithm='ring')"),
    (lambda c, x: ccl.Communicator("fp16"), "ccl.Communicator(codec='fp16')"),
])
def test_misuse_raises_type_error_naming_the_right_call(call, right):
    c = ccl.Communicator(codec="fp16", algorithm="ring", min_compress_bytes=0)
    with pytest.raises(TypeError) as info:
        call(c, np.ones(8, np.float32))
    assert right in str(info.value)
    assert c.stats()["calls"] == 0  # refused before anything ran


def test_defaults_are_written_once():
    """The functions' and the Communicator's defaults are the Options' own."""
    for func in (*FUNCTIONS.values(), ccl.Communicator.__init__):
        for name, param in inspect.signature(func).parameters.items():
            if name in ("op", "check_finite") or (name == "algorithm"
                                                  and func is not ccl.reduce_scatter):
                assert param.default == getattr(Options, name), (func, name)


def test_option_properties_are_explicit_and_settable():
    c = ccl.Communicator(codec="fp16", algorithm="ring")
    for name in ("codec", "op", "algorithm", "check_finite", "timeout", "partition_bytes",
                 "min_compress_bytes", "segment_bytes", "link_gbps", "cross_algorithm"):
        prop = vars(ccl.Communicator)[name]
        assert isinstance(prop, property) and prop.fset is not None and prop.__doc__, name
    c.algorithm = "direct"
    c.codec = {"id": "3lc", "s": 1.5}
    assert c.algorithm == c.options.algorithm == "direct"
    assert c.codec.get_config()["id"] == "3lc"
    with pytest.raises(ValueError, match="algorithm must be one of"):
        c.algorithm = "rign"


@pytest.mark.mpi
def test_keyword_calls_run_compressed(comm):
    """The call a newcomer writes with keywords compresses (fp16 sends half the bytes)."""
    x = np.full(100_000, 1.0 + comm.rank, np.float32)
    plain = ccl.Communicator(comm, algorithm="ring", min_compress_bytes=0)
    half = ccl.Communicator(comm, algorithm="ring", min_compress_bytes=0)
    exact = plain.allreduce(x, key="w")
    y = half.allreduce(x, key="w", codec="fp16", timeout=60)
    np.testing.assert_array_equal(y, exact)  # small integers are exact in fp16
    if comm.size > 1:
        assert half.stats()["bytes_sent"] < 0.6 * plain.stats()["bytes_sent"]
