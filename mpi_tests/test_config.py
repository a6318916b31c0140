"""Every CCL_* variable: one set of parsing rules, a warning for unknown ones, one docs table."""

import math
import os
import re
import subprocess
import sys
import warnings

import pytest

from ccl import config

DOCS = os.path.join(os.path.dirname(__file__), "..", "docs")


@pytest.mark.parametrize("name, text, value", [
    ("CCL_TIMEOUT", "2.5", 2.5), ("CCL_TIMEOUT", "0", math.inf), ("CCL_TIMEOUT", " ", None),
    ("CCL_LINK_GBPS", "2.5", 2.5), ("CCL_LINK_GBPS", "Probe", "probe"),
    ("CCL_SEGMENT_BYTES", "0", 0), ("CCL_SEGMENT_BYTES", "4096", 4096),
    ("CCL_NUM_THREADS", "3", 3), ("CCL_LOCAL_SIZE", "2", 2),
    ("CCL_NUMBA_CACHE", "yes", True), ("CCL_NUMBA_CACHE", "OFF", False),
    ("CCL_CUDA_AWARE", "1", True), ("CCL_SKIP_LAUNCH_CHECK", "", None),
])
def test_values_parse_by_one_rule(name, text, value):
    assert config.read(name, {name: text}) == value
    assert config.read(name, {}) is None  # unset: the default applies


@pytest.mark.parametrize("name, text", [
    ("CCL_TIMEOUT", "abc"), ("CCL_TIMEOUT", "-1"), ("CCL_TIMEOUT", "nan"),
    ("CCL_LINK_GBPS", "fast"), ("CCL_LINK_GBPS", "0"), ("CCL_LINK_GBPS", "-1"),
    ("CCL_SEGMENT_BYTES", "-1"), ("CCL_SEGMENT_BYTES", "1MB"), ("CCL_SEGMENT_BYTES", "x"),
    ("CCL_NUM_THREADS", "0"), ("CCL_LOCAL_SIZE", "two"),
    ("CCL_NUMBA_CACHE", "maybe"), ("CCL_CUDA_AWARE", "2"),
])
def test_bad_values_name_the_variable(name, text):
    with pytest.raises(ValueError, match=name):
        config.read(name, {name: text})


def test_arguments_follow_the_variables_rules():
    # 0 turns a knob off in an argument exactly as in the variable
    assert config.timeout_seconds(0) == config.read("CCL_TIMEOUT", {"CCL_TIMEOUT": "0"})
    assert config.segment_bytes(0) == config.read("CCL_SEGMENT_BYTES",
                                                  {"CCL_SEGMENT_BYTES": "0"})
    for bad in (-1, "abc", float("nan")):
        with pytest.raises(ValueError, match="timeout"):
            config.timeout_seconds(bad)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="segment_bytes"):
            config.segment_bytes(bad)


def test_unknown_variables_get_a_warning_with_a_suggestion():
    env = {"CCL_TIMOUT": "3", "CCL_TIMEOUT": "3", "OTHER": "1"}
    assert config.unknown_variables(env) == ["CCL_TIMOUT"]
    with pytest.warns(RuntimeWarning, match="CCL_TIMOUT.*did you mean CCL_TIMEOUT"):
        config.warn_unknown(env)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config.warn_unknown({"CCL_TIMEOUT": "3"})  # known variables: silence


def test_importing_ccl_warns_about_unknown_variables():
    env = dict(os.environ, CCL_SEGMENT_BYTS="1")
    out = subprocess.run([sys.executable, "-c", "import ccl"], env=env, capture_output=True,
                         text=True, check=True)
    assert "CCL_SEGMENT_BYTS" in out.stderr and "CCL_SEGMENT_BYTES" in out.stderr


def test_no_module_reads_a_ccl_variable_by_itself():
    root = os.path.join(os.path.dirname(__file__), "..", "ccl")
    pattern = re.compile(r"environ[^\n]*[\"']CCL_|getenv\([\"']CCL_")
    readers = []
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            if name.endswith(".py") and os.path.basename(path) != "config.py":
                with open(path, encoding="utf-8") as f:
                    if pattern.search(f.read()):
                        readers.append(os.path.relpath(path, root))
    assert readers == []


def test_the_docs_table_lists_every_variable():
    with open(os.path.join(DOCS, "configuration.md"), encoding="utf-8") as f:
        listed = set(re.findall(r"^\| `(CCL_[A-Z_]+)`", f.read(), flags=re.M))
    assert listed == set(config.VARIABLES)


def test_variables_the_slurm_templates_read_draw_no_warning():
    """What slurm/README.md tells users to set is known to ccl (and in the docs table)."""
    root = os.path.join(os.path.dirname(__file__), "..", "slurm")
    named = set()
    for name in os.listdir(root):
        with open(os.path.join(root, name), encoding="utf-8") as f:
            named |= set(re.findall(r"\bCCL_[A-Z_]+\b", f.read()))
    assert {"CCL_SLURM_DIR", "CCL_SRUN_MPI", "CCL_NODE_TMP"} <= named
    assert config.unknown_variables({name: "x" for name in named}) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config.warn_unknown({"CCL_SLURM_DIR": "/x", "CCL_SRUN_MPI": "pmi2", "CCL_NODE_TMP": "/t"})

@pytest.mark.parametrize("name", ["CCL_LOCAL_SIZE", "CCL_NUM_THREADS", "CCL_SEGMENT_BYTES"])
@pytest.mark.parametrize("text", ["\u00b2", "\u0663", "\uff14"])  # superscript 2, Arabic 3, wide 4
def test_digits_int_refuses_name_the_variable(name, text):
    with pytest.raises(ValueError, match=name):
        config.read(name, {name: text})
    assert config.check_environment({name: text}) is not None


def test_launcher_variables_with_other_digits_are_ignored():
    from ccl import launch

    assert launch.launcher_world_size({"PMI_SIZE": "\u00b2"}) == (None, None)


def test_every_variable_is_checked_in_one_call():
    assert config.check_environment({}) is None
    error = config.check_environment({"CCL_TIMEOUT": "2", "CCL_STALL_CHECK_SECONDS": "x"})
    assert isinstance(error, ValueError) and "CCL_STALL_CHECK_SECONDS" in str(error)
    assert config.read("CCL_STALL_CHECK_SECONDS", {"CCL_STALL_CHECK_SECONDS": "0"}) == math.inf


ONECCL = ["CCL_ROOT", "CCL_CONFIGURATION", "CCL_CONFIGURATION_PATH", "CCL_WORKER_COUNT",
          "CCL_WORKER_AFFINITY", "CCL_LOG_LEVEL", "CCL_ATL_TRANSPORT", "CCL_ALLREDUCE",
          "CCL_ALLREDUCE_SCALEOUT", "CCL_ZE_ENABLE", "CCL_KVS_MODE", "CCL_PROCESS_LAUNCHER",
          "CCL_LOCAL_RANK", "CCL_MNIC", "CCL_FUSION"]


def test_oneccl_variables_are_left_alone():
    env = dict.fromkeys(ONECCL, "1")
    assert config.unknown_variables(env) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config.warn_unknown(env)
    # a typo of ccl's own still warns next to them
    assert config.unknown_variables(dict(env, CCL_TIMOUT="3")) == ["CCL_TIMOUT"]


def test_importing_ccl_with_oneccl_variables_is_silent():
    env = dict(os.environ, **dict.fromkeys(ONECCL, "1"))
    out = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c", "import ccl"],
                         env=env, capture_output=True, text=True)
    assert out.returncode == 0 and "unknown ccl variable" not in out.stderr, out.stderr
