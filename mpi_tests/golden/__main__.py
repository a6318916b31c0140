"""``python -m mpi_tests.golden``: write the golden payloads of today's format version that are
missing (a new format version, codec or configuration); stored files are never overwritten.
``--check`` decodes every stored file instead, as ``mpi_tests/test_golden.py`` does."""

import argparse
import sys

from mpi_tests import golden


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m mpi_tests.golden", description=__doc__)
    parser.add_argument("--check", action="store_true",
                        help="decode every stored payload and compare, write nothing")
    args = parser.parse_args(argv)
    if args.check:
        for path in golden.stored_files():
            golden.check_file(path)
        print(f"{len(golden.stored_files())} golden files decode as they did")
        return 0
    written = golden.write()
    for path in written:
        print(f"wrote {path.relative_to(golden.HERE.parent.parent)}")
    print(f"{len(written)} files written; stored files are left as they are")
    return 0


if __name__ == "__main__":
    sys.exit(main())
