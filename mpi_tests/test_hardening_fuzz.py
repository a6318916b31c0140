"""Every registered codec's decoder against fuzzed payloads (docs/reliability.md).

Any byte string gives a valid result or ``ccl.PayloadError``: random bytes,
truncations, single bit flips and header edits of valid payloads, for every
codec in ``registered_codecs()`` (the test-only ones included) and the body
layouts of ``ccl.tools.fuzz.VARIANTS``. The properties are the ones the long
run (``python -m ccl.tools.fuzz``) uses; here each gets a few dozen examples.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ccl.codecs import CodecContext, get_codec, registered_codecs
from ccl.tools import fuzz
from mpi_tests.helpers.codec_checks import check_header_edits, check_malformed, check_random_bytes

CODECS = {repr(codec): codec for codec in fuzz.codecs_to_fuzz()}


def test_every_registered_codec_is_fuzzed():
    fuzzed = {codec.codec_id for codec in CODECS.values()}
    assert fuzzed == set(registered_codecs())


@pytest.mark.parametrize("name", sorted(CODECS))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.data_too_large])
@given(data=st.data())
def test_fuzzed_payload_gives_result_or_payload_error(name, data):
    codec = CODECS[name]
    kind, payload, ctx, valid = data.draw(fuzz.cases(codec), label="case")
    with np.errstate(all="ignore"):
        fuzz.check_decode(codec, payload, ctx)
        if codec.homomorphic and valid is not None:
            fuzz.check_add(codec, valid, payload, ctx)


@pytest.mark.parametrize("name", sorted(CODECS))
def test_header_edits_truncations_and_bit_flips(name):
    codec = CODECS[name]
    rng = np.random.default_rng(11)
    for n in (0, 1, 7, 333):
        x = rng.standard_normal(n).astype(np.float32)
        ctx = CodecContext(step=2, key="w", chunk=1, n=n)
        check_header_edits(codec, x, ctx)
        check_header_edits(codec, x)
        if n:
            check_malformed(codec, x, ctx, rng=rng, flips=40)
    nan = np.full(5, np.nan, np.float32)  # a flagged, header-only payload
    check_header_edits(codec, nan)


@pytest.mark.parametrize("name", sorted(CODECS))
@settings(max_examples=25, deadline=None)
@given(data=st.binary(max_size=300))
def test_random_bytes(name, data):
    with np.errstate(all="ignore"):
        check_random_bytes(CODECS[name], data)


def test_edit_header_sets_the_field_it_names():
    codec = get_codec("fp16")
    payload = codec.encode(np.ones(6, np.float32))
    edited = fuzz.edit_header(payload, "contributors", 9)
    assert codec.read_header(edited).contributors == 9
    assert fuzz.edit_header(payload, "n", 5)[16] == 5
    with pytest.raises(Exception, match="version"):
        codec.read_header(fuzz.edit_header(payload, "version", 7))
    # a payload too short for the field comes back unchanged
    assert fuzz.edit_header(payload[:10], "n", 1).tobytes() == payload[:10].tobytes()


def test_the_property_catches_a_decoder_that_breaks_the_contract(monkeypatch):
    """The oracle can fail: a decoder raising IndexError or miscounting is reported."""
    codec = get_codec("none")
    payload = codec.encode(np.ones(4, np.float32))

    def index_error(header, body, ctx):
        raise IndexError("read past the body")

    monkeypatch.setattr(codec, "_decode", index_error)
    with pytest.raises(IndexError):
        fuzz.check_decode(codec, payload)
    monkeypatch.setattr(codec, "_decode", lambda header, body, ctx: np.zeros(3, np.float32))
    # the base class turns a miscount into PayloadError
    assert fuzz.check_decode(codec, payload) is None
    # (on the class: a public instance attribute would become part of the codec's config)
    monkeypatch.setattr(type(codec), "decode_with_header",
                        lambda self, p, ctx=None: (np.zeros(4, np.int64), self.read_header(p)))
    with pytest.raises(AssertionError):
        fuzz.check_decode(codec, payload)


def test_fuzz_command_line_runs_and_counts(capsys):
    assert fuzz.main(["--examples", "5", "--codecs", "fp16,topk"]) == 0
    out = capsys.readouterr().out
    assert "FP16Codec()" in out and "TopKCodec(" in out
    assert "total: 20 inputs" in out  # fp16, topk and the two topk variants, 5 each
