# The live fuzz run (tools/chaos/livefuzz.py, `python -m tools.chaos.fuzz
# --live`) against a real name server and 3-broker group with a peer
# secret: structure-aware hostile frames, the crafted inputs first
# (the 2 KB deep-JSON frame, 1025 extFields, a header past 1 MiB, deep
# bodies, SQL92 bombs, a 16,385-message batch, a misaddressed peer
# heartbeat, a 60 MiB HELLO, 2 GiB announcements), at the master's and a
# follower's remoting ports, the name server's and a follower's peer port.
# The run must end with every process alive under the same pid, RSS under
# its bound, descriptors (store files aside) back where they were, no connection left
# hanging, the producer's acknowledged sends all stored and the replicas
# identical (chain CRC online, verifyStore --cq and the committed entries
# byte for byte offline).  LEDGERMQ_FUZZ_LIVE sets the frames per port.
# Slow: a real name server + 3-broker group under a live fuzz run.
import os

import pytest

from tools.chaos.livefuzz import LiveReport, run_started

pytestmark = pytest.mark.slow

FRAMES = int(os.environ.get("LEDGERMQ_FUZZ_LIVE", "1500"))
FD_SLACK = 4


async def test_live_fuzz_run_leaves_the_group_whole(tmp_path):
    report = LiveReport(seed=27)
    await run_started(str(tmp_path), report, None, FRAMES, secure=True)
    report.judge()
    print(report.text())
    assert report.ok, report.text()
    assert {p.kind for p in report.ports} == {"remoting", "namesrv", "peer"} and len(report.ports) == 4
    for port in report.ports:
        assert port.frames >= FRAMES, port
        assert port.ended.get("hung", 0) == 0 and port.ended.get("refused", 0) == 0, port
    assert len(report.procs) == 4 and all(p.alive and p.rss_peak > 0 for p in report.procs.values())
    for p in report.procs.values():
        assert p.fds_last <= p.fds_first + FD_SLACK, p
    assert report.sends_ok > 0 and report.stored == report.sends_ok
    assert len(report.chain_crcs) == 3 and len(set(report.chain_crcs.values())) == 1
