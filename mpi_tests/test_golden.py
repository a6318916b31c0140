"""Golden wire-format payloads: every stored payload still decodes to what it decoded to.

The files in ``mpi_tests/golden/v<N>/`` were written by the version of ccl
that introduced format version ``N`` (or the codec, or the configuration);
:mod:`mpi_tests.golden` says how they are made. A payload written by an
earlier version must be decoded, bit for bit, by every later one.
"""

import base64
import json
import shutil

import numpy as np
import pytest

import ccl
from ccl.codecs import get_codec
from ccl.codecs.header import FORMAT_VERSION, HEADER_SIZE
from mpi_tests import golden

FILES = golden.stored_files()


@pytest.mark.parametrize("path", FILES, ids=[f"{p.parent.name}/{p.stem}" for p in FILES])
def test_stored_payload_decodes_as_it_did(path):
    golden.check_file(path)


def test_every_codec_configuration_has_payloads_of_this_format_version():
    """A new codec, configuration or format version comes with its golden payloads."""
    stored = {p.stem for p in golden.version_dir(FORMAT_VERSION).glob("*.json")}
    missing = sorted(set(golden.cases()) - stored)
    assert not missing, f"no golden payloads for {missing}: run python -m mpi_tests.golden"


def _flip(path, tmp_path, entry, offset):
    """A copy of golden file ``path`` with one byte of an entry's payload flipped."""
    copy = tmp_path / path.name
    document = json.loads(path.read_text())
    payload = bytearray(base64.b64decode(document["entries"][entry]["payload"]))
    payload[offset] ^= 0x5A
    document["entries"][entry]["payload"] = base64.b64encode(bytes(payload)).decode()
    copy.write_text(json.dumps(document))
    return copy


@pytest.mark.parametrize("name,offset", [("fp16-float32", HEADER_SIZE + 10),  # a value
                                         ("topk-k=1-float32", HEADER_SIZE + 16),  # its index
                                         ("thc-float32", 5)])  # its dtype code
def test_a_changed_payload_is_caught(tmp_path, name, offset):
    path = golden.version_dir(FORMAT_VERSION) / f"{name}.json"
    golden.check_file(path)
    changed = _flip(path, tmp_path, 0, offset)
    with pytest.raises((AssertionError, ccl.PayloadError)):
        golden.check_file(changed)


def test_a_changed_decoder_is_caught(monkeypatch):
    """A decoder that reads the same bytes as other values fails the comparison."""
    path = golden.version_dir(FORMAT_VERSION) / "3lc-float32.json"
    codec_class = type(get_codec("3lc"))
    decode = codec_class._decode

    def off_by_a_little(self, header, body, ctx):
        return decode(self, header, body, ctx) * np.float32(1 + 2**-20)

    monkeypatch.setattr(codec_class, "_decode", off_by_a_little)
    with pytest.raises(AssertionError, match="decode differently"):
        golden.check_file(path)


def test_writer_adds_missing_files_and_never_overwrites(tmp_path):
    folder = golden.version_dir(FORMAT_VERSION, tmp_path)
    folder.mkdir(parents=True)
    kept = folder / "fp16-float32.json"
    kept.write_text("written by an earlier version\n")
    shutil.copy(golden.version_dir(FORMAT_VERSION) / "none-float32.json", folder)
    written = golden.write(tmp_path)
    assert kept.read_text() == "written by an earlier version\n"
    assert {p.name for p in written} == {f"{name}.json" for name in golden.cases()} - {
        "fp16-float32.json", "none-float32.json"}
    for path in written:
        golden.check_file(path)
    assert golden.write(tmp_path) == []  # nothing missing: nothing written
