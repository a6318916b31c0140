"""``python -m ccl.bench calibrate``: measure the cost model's codec inputs on this machine.

For every codec (``--codecs``, default: every registered one) it encodes and
decodes ``--elements`` standard normal float32 values on one core
(:func:`ccl.collectives.figures.measure_figures`, timed): encode and decode
GB/s, payload bits per value, the one-shot relative error, and whether
payloads add exactly. The figures go to the per-user calibration file
(:func:`ccl.collectives.figures.calibration_path`, ``~/.cache/ccl/model.json``;
``--out`` for another), where the projection (``python -m ccl.bench.model``),
the validation report and ``auto`` outside a collective find them. Inside a
collective ``auto`` measures the codec as the ranks run it instead, and
takes bits and error from a small sample every rank measures alike, so a
calibration file on one machine cannot make ranks decide differently.

Needs no MPI; run it on an otherwise idle machine: other work slows the
codecs, and the model applies the rank's share of the cores itself.
"""

import argparse
import sys

__all__ = ["main", "calibrate"]


def calibrate(codecs, elements):
    """``{config_hash (hex): CodecFigures}`` of ``codecs``, measured on one core."""
    from ccl.collectives import figures

    return {f"{codec.config_hash:016x}": figures.measure_figures(codec, elements, timed=True)
            for codec in codecs}


def main(argv=None):
    from ccl.codecs import get_codec, registered_codecs
    from ccl.collectives import figures

    from .cli import codec_arg, size_arg

    parser = argparse.ArgumentParser(
        prog="python -m ccl.bench calibrate",
        description="Measure every codec's encode/decode speed on one core, its payload bits "
                    "and one-shot error, for the cost model; write them to the per-user "
                    "calibration file.")
    parser.add_argument("--codecs", nargs="+", type=codec_arg, default=None,
                        help="codec ids or JSON configs (default: every registered codec)")
    parser.add_argument("--elements", type=size_arg, default=1 << 22,
                        help="float32 values per sample (default: %(default)s)")
    parser.add_argument("--out", default=None,
                        help=f"the file to write (default: {figures.calibration_path()})")
    args = parser.parse_args(argv)
    codecs = args.codecs or [get_codec(name) for name in registered_codecs()
                             if not name.startswith("test")]
    found = calibrate(codecs, args.elements)
    names = {f"{c.config_hash:016x}": c.codec_id for c in codecs}
    print(f"{'codec':>10} {'encode GB/s':>12} {'decode GB/s':>12} {'bits/value':>11} "
          f"{'one-shot error':>15} {'adds exactly':>13}")
    for key, fig in found.items():
        print(f"{names[key]:>10} {fig.encode_gbps:12.2f} {fig.decode_gbps:12.2f} "
              f"{fig.bits:11.3f} {fig.error:15.3e} {str(fig.exact_sum):>13}")
    merged = dict(figures.load_calibration(args.out))
    merged.update(found)
    print(f"written to {figures.save_calibration(merged, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
