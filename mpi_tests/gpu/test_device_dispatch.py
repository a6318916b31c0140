"""How a codec finds its device twin: along the class hierarchy, never past an override.

Runs under the CUDA simulator like the rest of ``mpi_tests/gpu``: ``simulated_device``
sends numpy arrays down the device paths, and the twins' kernels run there.
"""

import subprocess
import sys

import numpy as np
import pytest

import ccl.codecs
from ccl._xp import simulated_device
from ccl.codecs import Codec, CodecContext, ThreeLCCodec, TopKCodec, device
from ccl.codecs.sparse._cuda import SparseTwin
from ccl.codecs.threelc._cuda import ThreeLCTwin

BUILT_IN = [getattr(ccl.codecs, name) for name in ccl.codecs.__all__
            if isinstance(getattr(ccl.codecs, name), type)
            and issubclass(getattr(ccl.codecs, name), Codec)
            and getattr(ccl.codecs, name) is not Codec]


class PlainThreeLC(ThreeLCCodec):
    """A user's 3LC that changes nothing the twin stands in for."""


class CountingThreeLC(ThreeLCCodec):
    """A user's 3LC with its own ``_encode`` (here: the built-in one, counted)."""

    def __init__(self, s=1.0):
        super().__init__(s)
        self._calls = []

    def _encode(self, x, ctx):
        self._calls.append(x)
        return super()._encode(x, ctx)


class BelowTheOverride(CountingThreeLC):
    """Declares nothing: the override of its parent still stands between it and the twin."""


class HostTopK(TopKCodec):
    """Asks for the host path explicitly."""

    device_twin = None


class TopKOwnSelection(TopKCodec):
    """Overrides a hook the twin calls (``_select``), not one it replaces: keeps the twin."""

    def _select(self, x, ctx):
        return super()._select(x, ctx)


class Float32Codec(Codec):
    """A user's codec with a twin of its own, in its own module."""

    codec_id, wire_id, error_feedback = "float32-twin-test", 201, False
    device_twin = "test_device_dispatch:Float32Twin"

    def _encode(self, x, ctx):
        return x.astype(np.float32).view(np.uint8), 0

    def _decode(self, header, body, ctx):
        return body.view(np.float32).copy()


class Float32Twin(device.DeviceTwin):
    calls = []

    @staticmethod
    def encode(codec, x, ctx, be):
        Float32Twin.calls.append("encode")
        return be.xp.ascontiguousarray(x, dtype=np.float32).view(np.uint8), 0

    @staticmethod
    def decode(codec, header, body, ctx, be):
        Float32Twin.calls.append("decode")
        return body.view(np.float32).copy()


def _x(n=1009):
    x = np.random.default_rng(5).standard_normal(n).astype(np.float32)
    x[100:300] = 0.0
    return x


@pytest.mark.parametrize("cls", BUILT_IN, ids=lambda c: c.codec_id)
def test_every_built_in_codec_has_a_twin(cls):
    twin = device.twin_for(cls)
    assert twin is not None and issubclass(twin, device.DeviceTwin)


def test_a_plain_subclass_uses_the_built_in_twin(monkeypatch):
    assert device.twin_for(PlainThreeLC) is ThreeLCTwin
    calls = []
    encode = ThreeLCTwin.encode

    def spy(codec, x, ctx, be):
        calls.append(type(codec))
        return encode(codec, x, ctx, be)

    monkeypatch.setattr(ThreeLCTwin, "encode", staticmethod(spy))
    codec, x = PlainThreeLC(s=1.5), _x()
    with simulated_device():
        payload = codec.encode(x)
        decoded = codec.decode(payload)
    assert calls == [PlainThreeLC]
    assert payload.tobytes() == codec.encode(x).tobytes()
    assert np.array_equal(decoded, codec.decode(payload))


@pytest.mark.parametrize("cls", [CountingThreeLC, BelowTheOverride])
def test_overriding_a_host_method_takes_the_host_path(cls, monkeypatch):
    """The twin would ignore the override: the codec's own CPU code runs on a host copy."""
    assert device.twin_for(cls) is None

    def fail(*args):
        raise AssertionError("the twin ran for a codec that overrides _encode")

    monkeypatch.setattr(ThreeLCTwin, "encode", staticmethod(fail))
    monkeypatch.setattr(ThreeLCTwin, "decode", staticmethod(fail))
    codec, x = cls(s=1.5), _x()
    with simulated_device():
        payload = codec.encode(x)
        decoded = codec.decode(payload)
    assert len(codec._calls) == 1
    assert payload.tobytes() == ThreeLCCodec(s=1.5).encode(x).tobytes()
    assert np.array_equal(decoded, codec.decode(payload))


def test_device_twin_none_and_hooks_the_twin_calls():
    assert device.twin_for(HostTopK) is None
    assert device.twin_for(TopKOwnSelection) is SparseTwin
    x = _x()
    expected = TopKCodec(density=0.1).encode(x).tobytes()
    for cls in (HostTopK, TopKOwnSelection):
        with simulated_device():
            payload = cls(density=0.1).encode(x, CodecContext())
        assert payload.tobytes() == expected


def test_a_user_codec_names_its_own_twin():
    Float32Twin.calls.clear()
    codec, x = Float32Codec(), _x(7)
    with simulated_device():
        decoded = codec.decode(codec.encode(x))
    assert Float32Twin.calls == ["encode", "decode"]
    assert np.array_equal(decoded, x)


def test_a_malformed_twin_name_says_what_is_expected():
    class Broken(Codec):
        codec_id, wire_id = "broken-twin-test", 202
        device_twin = "no colon here"

    with pytest.raises(ValueError, match="package.module:Class"):
        device.twin_for(Broken)


def test_numpy_without_row_stack_gets_the_alias_numba_cuda_compiles_with():
    # numpy 2.5 removed np.row_stack; numba-cuda 0.30 looks it up when it compiles its first
    # kernel, so on an H100 with both every twin failed until the twins' common module put
    # the alias back. A fresh interpreter, since this one imported the twins long ago.
    code = ("import numpy as np\n"
            "if hasattr(np, 'row_stack'):\n"
            "    del np.row_stack\n"
            "import ccl.codecs._cuda_common\n"
            "assert np.row_stack is np.vstack\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=240)
    assert result.returncode == 0, result.stderr
