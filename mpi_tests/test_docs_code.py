"""Every code example of the documentation is executed by the test suite.

A page's Python is either a ``{doctest}`` block (run by ``make docs``, the
doctest builder) or a ``{literalinclude}`` of a script in ``examples/`` that
``test_examples.py`` runs; a plain Python block, which nothing would run, is
an error here. The README's blocks (GitHub shows them, Sphinx does not build
the README) run here as one script on 4 ranks.
"""

import glob
import os
import re
import subprocess
import sys

import pytest

from mpi_tests.helpers.launch import ROOT, launch

DOCS = os.path.join(ROOT, "docs")
# a fence's info string: ```python, ```py, ```pycon, ```{code-block} python, ```{code} py
FENCE = re.compile(r"^(`{3,}|~{3,})\s*(\{[\w-]+\}\s*)?([\w-]*)", re.M)
PYTHON = {"python", "py", "python3", "pycon", "ipython"}


def pages():
    return sorted(glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True))


def blocks(text):
    """``(directive, language, first line number)`` of every fenced block opened in ``text``."""
    found, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        if fence is not None:
            if line.strip() == fence:
                fence = None
            continue
        match = FENCE.match(line)
        if match:
            fence = match.group(1)
            directive = (match.group(2) or "").strip().strip("{}")
            found.append((directive, match.group(3).lower(), number))
    return found


def test_no_page_has_python_that_nothing_runs():
    unrun = []
    for path in pages():
        with open(path, encoding="utf-8") as f:
            for directive, language, line in blocks(f.read()):
                if directive in ("", "code-block", "code", "sourcecode") and language in PYTHON:
                    unrun.append(f"{os.path.relpath(path, ROOT)}:{line}")
    assert not unrun, ("Python blocks no test runs (make them {doctest} blocks, or scripts "
                       f"in examples/ that test_examples.py runs, included): {unrun}")


def test_every_included_example_is_run_by_a_test():
    with open(os.path.join(ROOT, "mpi_tests", "test_examples.py"), encoding="utf-8") as f:
        tests = f.read()
    included = set()
    for path in pages():
        with open(path, encoding="utf-8") as f:
            included |= set(re.findall(r"^`{3,}\{literalinclude\}\s+\S*examples/(\S+\.py)\s*$",
                                       f.read(), re.M))
    assert {"ddp_hook.py", "quickstart.py", "torch_two_lines.py"} <= included
    assert sorted(name for name in included if f'"{name}"' not in tests) == []


def test_fence_parsing_finds_plain_python():
    text = "```python\nx = 1\n```\n```{doctest}\n>>> 1\n1\n```\n````{code-block} py\ny\n````\n"
    assert blocks(text) == [("", "python", 1), ("doctest", "", 4), ("code-block", "py", 8)]


@pytest.mark.serial
def test_readme_code_runs_on_four_ranks(tmp_path):
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    code = re.findall(r"^```python\n(.*?)^```", readme, re.M | re.S)
    assert len(code) >= 2
    script = tmp_path / "readme.py"
    script.write_text("\n".join(code) + "\nassert isinstance(state, dict)\n")
    result = launch(["-m", "mpi4py", str(script)], 4, 240)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    error = float(re.search(r"max error vs MPI_Allreduce: (\S+)", result.stdout).group(1))
    assert 0 < error < 1e-2


def test_codec_guide_quotes_the_benchmarks():
    """A speedup in the codec guide is one that docs/benchmarks.md holds, not a stale copy."""
    with open(os.path.join(DOCS, "codecs", "README.md"), encoding="utf-8") as f:
        guide = f.read()
    with open(os.path.join(DOCS, "benchmarks.md"), encoding="utf-8") as f:
        measured = set(re.findall(r"\b\d+\.\d+x\b", f.read()))
    assert sorted(set(re.findall(r"\b\d+\.\d+x\b", guide)) - measured) == []


@pytest.mark.serial
def test_torch_digits_help_says_what_auto_does():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, "-m", "ccl.bench.torch_digits", "--help"],
                            capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "sends uncompressed" not in text and "'auto' measures the link" in text
