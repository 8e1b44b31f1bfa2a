"""The benchmark's Kamailio: its dispatcher list read from kamcmd's output, and Kamailio itself started from the
shipped configuration, probing its workers, pinned, counted and stopped with its whole process tree."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import psutil
import pytest

from bench.kamailio import Balancer, BalancerError, DispatcherTarget, parse_dispatcher_list
from tests.support.peers import require_binary

LISTING = """{
\tNRSETS: 2
\tRECORDS: {
\t\tSET: {
\t\t\tID: 1
\t\t\tTARGETS: {
\t\t\t\tDEST: {
\t\t\t\t\tURI: sip:127.0.0.1:5993
\t\t\t\t\tFLAGS: AP
\t\t\t\t\tPRIORITY: 0
\t\t\t\t\tATTRS: {
\t\t\t\t\t\tBODY: duid=w1;maxload=0
\t\t\t\t\t}
\t\t\t\t}
\t\t\t\tDEST: {
\t\t\t\t\tURI: sip:127.0.0.1:5991
\t\t\t\t\tFLAGS: IP
\t\t\t\t}
\t\t\t}
\t\t}
\t\tSET: {
\t\t\tID: 2
\t\t\tTARGETS: {
\t\t\t\tDEST: {
\t\t\t\t\tURI: sip:127.0.0.1:6000
\t\t\t\t\tFLAGS: AX
\t\t\t\t}
\t\t\t}
\t\t}
\t}
}
"""


def test_the_dispatcher_list_is_read_set_by_set() -> None:
    targets = parse_dispatcher_list(LISTING)
    assert targets == [
        DispatcherTarget(set_id=1, uri="sip:127.0.0.1:5993", flags="AP"),
        DispatcherTarget(set_id=1, uri="sip:127.0.0.1:5991", flags="IP"),
        DispatcherTarget(set_id=2, uri="sip:127.0.0.1:6000", flags="AX"),
    ]
    assert [t.probed_active for t in targets] == [True, False, False]
    assert parse_dispatcher_list("") == []


def test_a_missing_configuration_is_named(tmp_path: Path) -> None:
    balancer = Balancer(workers=["sip:127.0.0.1:5990"], directory=tmp_path, config=tmp_path / "nope.cfg")
    with pytest.raises(BalancerError, match=r"no Kamailio configuration at .*nope\.cfg"):
        balancer.start()


class _OptionsAnswerer:
    """A UDP socket that answers every SIP request it gets with 200 OK (Kamailio's OPTIONS probes), from a thread
    until closed."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.answered = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="options-answerer", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                data, peer = self.sock.recvfrom(65535)
            except TimeoutError:
                continue
            lines = data.decode("utf-8", "replace").split("\r\n")
            keep = [h for h in lines[1:] if h.split(":")[0].lower() in ("via", "from", "to", "call-id", "cseq")]
            reply = "SIP/2.0 200 OK\r\n" + "\r\n".join(keep) + "\r\nContent-Length: 0\r\n\r\n"
            self.sock.sendto(reply.encode(), peer)
            self.answered += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.mark.peer
@pytest.mark.timeout(60)
def test_kamailio_probes_its_workers_is_pinned_counted_and_stopped_whole(tmp_path: Path) -> None:
    require_binary("kamailio")
    require_binary("kamcmd", package="kamailio")
    answering = _OptionsAnswerer()
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # bound, never answers
    silent.bind(("127.0.0.1", 0))
    workers = [f"sip:127.0.0.1:{answering.port}", f"sip:127.0.0.1:{silent.getsockname()[1]}"]
    cores = sorted(psutil.Process().cpu_affinity())[:1]
    balancer = Balancer(workers=workers, directory=tmp_path, children=2, cores=cores)
    try:
        balancer.start()
        tree = list(balancer.tree)
        assert len(tree) >= 4  # the main process, its SIP children, timers, the ctl handler
        assert all(process.cpu_affinity() == cores for process in tree)
        deadline = time.monotonic() + 15
        while not (flags := {t.uri: t for t in balancer.targets()})[workers[0]].probed_active:
            assert time.monotonic() < deadline, f"the answering worker never became active: {flags}"
            time.sleep(0.2)  # Kamailio probes on its 1 s timer
        assert answering.answered >= 1 and not flags[workers[1]].probed_active
        with pytest.raises(BalancerError, match="not every worker answered"):
            balancer.wait_active(within=0.5)
        assert balancer.cpu_s() > 0
    finally:
        balancer.stop()
        answering.close()
        silent.close()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in tree)


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
