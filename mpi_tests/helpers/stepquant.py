"""A small lossy codec for tests: registered as ``test-stepquant`` by the suite's conftest."""

import numpy as np

from ccl.codecs import Codec, register_codec
from ccl.errors import PayloadError


@register_codec
class StepQuantCodec(Codec):
    """Test-only lossy codec: rounds to multiples of max|x|/levels (deterministic, biased).

    Small and exact enough to check the error-feedback machinery of every
    algorithm before (and independently of) the real codecs.
    """

    codec_id = "test-stepquant"
    wire_id = 250
    bits_per_value = 8.0  # an int8 per value (the scale is negligible)

    def __init__(self, levels=3):
        self.levels = int(levels)

    def _encode(self, x, ctx):
        scale = float(np.abs(x).max()) / self.levels if x.size else 0.0
        q = np.zeros(x.size, np.int8) if scale == 0 else np.rint(x / scale).astype(np.int8)
        return np.concatenate([np.frombuffer(np.float64(scale).tobytes(), np.uint8),
                               q.view(np.uint8)]), 0

    def _decode(self, header, body, ctx):
        if body.size != 8 + header.n:
            raise PayloadError("bad body")
        scale = body[:8].view(np.float64)[0]
        return (body[8:].view(np.int8).astype(np.float64) * scale).astype(np.float32)
