"""tests/support/machine.py: the busy-machine witness counts our own process tree apart from everyone else's,
and a missed quality bar becomes "machine too busy" only when the machine was."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.support.machine import MachineLoad, MachineWatch, assert_quality, machine_too_busy

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def load(*, others: float, steal: float = 0.0, cores: int = 2) -> MachineLoad:
    return MachineLoad(seconds=10.0, cores=cores, ours_cores=1.0, others_cores=others, steal=steal, load_average=3.0)


CPU_SPIN = "import time\nwhile time.process_time() < {seconds}: sum(range(1000))"


def test_our_own_cpu_and_our_childrens_count_as_ours() -> None:
    watch = MachineWatch.start()
    start = time.process_time()
    while time.process_time() - start < 0.3:  # 0.3 s of CPU here, however busy the machine
        sum(range(1000))
    subprocess.run([sys.executable, "-c", CPU_SPIN.format(seconds=0.3)], check=True)  # and 0.3 s in a child
    got = watch.stop()
    assert got is not None
    # both spins (and the child's start-up), within a few clock ticks
    assert got.ours_cores * got.seconds >= 0.6 - 0.05, got.describe()


def test_a_process_outside_our_tree_counts_as_others() -> None:
    # sh backgrounds a spinning python and exits: the spinner is re-parented away from this test's tree
    spinner = "import time\nt=time.monotonic()\nwhile time.monotonic()-t<2.5: sum(range(1000))"
    subprocess.run(["sh", "-c", f'"{sys.executable}" -c "{spinner}" >/dev/null 2>&1 &'], check=True)
    watch = MachineWatch.start()
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        time.sleep(0.05)
    got = watch.stop()
    assert got is not None
    assert got.others_cores >= 0.5, got.describe()  # the spinner alone uses up to a core
    assert got.ours_cores < 0.2, got.describe()  # we slept
    assert got.busy and machine_too_busy(got)


def test_a_met_bar_passes_whatever_the_machine() -> None:
    assert_quality(True, "fine", load(others=2.0))
    assert_quality(True, "fine", None)


def test_a_missed_bar_on_a_busy_machine_is_an_xfail_naming_the_machine() -> None:
    busy = r"MACHINE TOO BUSY.*correlation 0\.81.*other processes used 1\.20"
    with pytest.raises(pytest.xfail.Exception, match=busy):
        assert_quality(False, "correlation 0.81", load(others=1.2))
    with pytest.raises(pytest.xfail.Exception, match=r"steal 9\.0%"):
        assert_quality(False, "overruns", load(others=0.0, steal=0.09))


def test_a_missed_bar_on_a_quiet_machine_is_the_gateways_failure() -> None:
    with pytest.raises(pytest.fail.Exception, match=r"correlation 0\.81; the machine was not too busy .*gateway's"):
        assert_quality(False, "correlation 0.81", load(others=0.3))
    with pytest.raises(pytest.fail.Exception, match="load is unknown"):
        assert_quality(False, "correlation 0.81", None)


def test_strict_mode_never_blames_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_TEST_STRICT_LOAD", "1")
    with pytest.raises(pytest.fail.Exception):
        assert_quality(False, "correlation 0.81", load(others=1.9))
