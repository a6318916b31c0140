"""The transport package: a collective as a ``with`` block, what a channel measured, the old name.

The channel's point-to-point payloads, MPI calls and staging are exercised by
every collective test (and ``test_staging.py``); these tests hold what the
package itself promises.
"""

import ast
import pathlib
import re
import threading

import numpy as np
import pytest
from mpi4py import MPI

import ccl
from ccl.transport import Channel, Measurements, channel
from ccl.transport import waits


def test_the_package_exports_the_channel():
    from ccl.transport.p2p import Channel as defined_there

    assert Channel is defined_there
    assert callable(channel) and channel.__module__ == "ccl.transport.p2p"


def test_the_old_waits_module_still_works_and_warns():
    import ccl.waits

    with pytest.warns(DeprecationWarning, match="ccl.transport.waits"):
        assert ccl.waits.stall_period is waits.stall_period
    with pytest.warns(DeprecationWarning):
        from ccl.waits import STALL_DEFAULT_S
    assert STALL_DEFAULT_S == waits.STALL_DEFAULT_S
    with pytest.raises(AttributeError):
        ccl.waits.no_such_name  # noqa: B018


def test_measurements_find_each_thing_once():
    m = Measurements()
    assert m.link() is None and m.latency() is None and m.thread_budget() is None
    probes = []

    def probe():
        probes.append("link")
        return 1.5, 1.2

    assert m.link(probe) == (1.5, 1.2) and m.link(probe) == (1.5, 1.2) == m.link()
    assert m.latency(lambda: 2e-5) == 2e-5 == m.latency(lambda: 1.0)
    assert m.thread_budget(lambda: (2, 0.5)) == (2, 0.5) == m.thread_budget()
    assert probes == ["link"]


def test_a_share_of_cores_found_without_the_load_is_found_again_to_measure_it():
    m, asked = Measurements(), []

    def find(measure):
        asked.append(measure)
        return {"share": 0.5, "other_cores": 1.0 if measure else None}

    assert m.cores_share() is None
    m.cores_share(find, measure=False)
    m.cores_share(find, measure=False)
    assert asked == [False]
    assert m.cores_share(find, measure=True)["other_cores"] == 1.0
    m.cores_share(find, measure=False)
    m.cores_share(find, measure=True)
    assert asked == [False, True]


def test_profiles_are_kept_per_speed_given_and_codec_speeds_per_configuration():
    m = Measurements()
    assert m.latest_profile is None
    assert m.profile(None, lambda: {"found": "first"}) == {"found": "first"}
    assert m.profile(2.0, lambda: {"found": "given"}) == {"found": "given"}
    assert m.profile(None, lambda: {"found": "again"}) == {"found": "first"}
    assert m.latest_profile == {"found": "given"}  # the latest found, not the latest asked
    assert m.profile(3.0) is None
    assert m.codec_speeds(7, lambda: ("fp16", (3.0, 4.0))) == (3.0, 4.0)
    assert m.codec_speeds(7, lambda: ("other", (0.0, 0.0))) == (3.0, 4.0)
    assert m.codec_speeds(8) is None
    assert m.codec_speeds_found() == {7: ("fp16", (3.0, 4.0))}


def _in_thread(function, seconds=60):
    """``function()`` in another thread; whether it returned within ``seconds``."""
    done = threading.Event()

    def run():
        function()
        done.set()

    # the agreement names the calling thread: the same name on every rank
    threading.Thread(target=run, daemon=True, name="ccl-test-transport").start()
    return done.wait(seconds)


@pytest.mark.mpi
def test_a_collective_that_raises_releases_the_channel(comm):
    ch = channel(comm)
    calls = ch.calls
    with ch.collective("first", None) as first:
        assert ch.activity == "first"
    with pytest.raises(RuntimeError, match="in the body"):
        with ch.collective("second", 5.0) as second:
            assert second != first and ch.timeout == 5.0
            raise RuntimeError("in the body")
    assert ch.activity == "idle" and ch.calls == calls + 2
    # another thread can take the channel: the lock was released on the way out
    x = np.full(10, comm.rank + 1, np.float32)
    result = []
    assert _in_thread(lambda: result.append(ccl.compressed_allreduce(
        x, "none", comm=comm, algorithm="ring", timeout=60)))
    np.testing.assert_array_equal(result[0], np.full(10, comm.size * (comm.size + 1) / 2))


@pytest.mark.mpi
def test_a_sub_communicator_channel_runs_collectives_too(comm):
    odd = comm.Split(comm.rank % 2, key=comm.rank)
    try:
        ch = Channel(odd, duplicate=False, scope="its half")
        with ch.collective("a sum on half the ranks", 60) as tag:
            total = ch.allreduce_sum(np.full(3, 1.0, np.float32))
            got = ch.sendrecv(np.full(4, ch.rank, np.uint8), (ch.rank + 1) % ch.size,
                              (ch.rank - 1) % ch.size, tag)
        np.testing.assert_array_equal(total, np.full(3, odd.size, np.float32))
        np.testing.assert_array_equal(got, np.full(4, (ch.rank - 1) % ch.size, np.uint8))
        assert ch.plain_bytes_sent <= ch.bytes_sent
    finally:
        odd.Free()


#: A channel's own state: only the transport writes it (the rest of ccl asks it through methods).
CHANNEL_STATE = {"bytes_sent", "plain_bytes_sent", "activity", "calls", "timeout", "route",
                 "measured"}


#: How ccl's modules name a channel (``channel(comm)``, ``call.channel``, hierarchical's two).
CHANNEL_NAMES = re.compile(r"channel|^(ch|local|cross)$")


def writes_of(source, names):
    """``[(line, attribute)]``: assignments to ``<a channel>.<name>`` in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            if isinstance(target, ast.Attribute) and target.attr in names \
                    and CHANNEL_NAMES.search(ast.unparse(target.value)):
                found.append((node.lineno, target.attr))
    return found


def test_only_the_transport_writes_a_channels_state():
    made_up = ("ch.bytes_sent += 3\nself.activity = 'x'\nch.describe('y')\n"
               "channel(comm).calls = 2\nbook.calls += 1\nlocal.activity: str = 'z'\n")
    assert writes_of(made_up, CHANNEL_STATE) == [(1, "bytes_sent"), (4, "calls"),
                                                 (6, "activity")]
    package = pathlib.Path(ccl.__file__).parent
    offenders = [f"{path.relative_to(package)}:{line} writes .{name}"
                 for path in sorted(package.rglob("*.py")) if "transport" not in path.parts
                 for line, name in writes_of(path.read_text(), CHANNEL_STATE)]
    assert not offenders, offenders


def test_traffic_counts_through_the_channels_methods():
    ch = Channel(MPI.COMM_SELF, duplicate=False)
    ch.bytes_sent, ch.plain_bytes_sent = 100, 10  # as after earlier calls
    before = ch.traffic()
    ch.bytes_sent += 50  # a call's payloads (isend counts them)
    ch.count_as_plain(before)
    assert ch.traffic() == (150, 60)
    ch.add_traffic(7, 2)
    assert ch.traffic() == (157, 62)
