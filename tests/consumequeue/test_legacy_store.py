# Reading plain (master-slave) RocketMQ stores: fixture stores written
# record by record with consumequeue/record.py exactly as CommitLog.doAppend
# lays them out (BLANK when record + 8 bytes do not fit, files at full
# size), then recovery of the valid end (clean, torn tail, bad CRC),
# record iteration, config/checkpoint/abort, md5 of the last files (plain
# and DLedger stores, through mqadmin) and the first differing offset of a
# master and a diverged slave.
import hashlib
import json
import os
import struct

import pytest
from click.testing import CliRunner

from broker.metadata.snapshot import read_config_dir
from consumequeue import record as M
from consumequeue.legacy_store import LegacyStore, compare_commitlogs, md5_files
from consumequeue.plainlog import PlainCommitlogWriter
from native import dispatch as D
from tools.mqadmin import cli

SEG = 4096


def msgs(n: int, start: int = 0, tag: str = "") -> list[M.MessageRecord]:
    out = []
    for i in range(start, start + n):
        out.append(M.MessageRecord(topic=("TopicA", "TopicB", "%RETRY%g")[i % 3], queue_id=i % 4,
                                   body=(b"body%d-%s-" % (i, tag.encode())) * (1 + i % 9),
                                   properties={"TAGS": f"t{i % 5}", "KEYS": f"key{i}"},
                                   store_timestamp=1_700_000_000_000 + i))
    return out


def write_plain_store(root, records, seg: int = SEG) -> list[tuple[int, int]]:
    """CommitLog.doAppend for each record (consumequeue.plainlog): QUEUEOFFSET
    from a per-queue counter, PHYSICALOFFSET the position, a BLANK closing a
    segment the record (+ 8 bytes) does not fit.  Returns (position, size)
    per record.  (tests/helpers/legacy_fixtures.py builds whole stores.)"""
    writer = PlainCommitlogWriter(str(root), seg)
    offsets: dict[tuple[str, int], int] = {}
    placed = []
    try:
        for rec in records:
            raw = bytearray(M.encode(rec))
            key = (rec.topic, rec.queue_id)
            M.set_queue_offset(raw, offsets.get(key, 0))
            offsets[key] = offsets.get(key, 0) + 1
            placed.append((writer.append(raw), len(raw)))
    finally:
        writer.close()
    return placed


def patch(root, pos: int, data: bytes, seg: int = SEG) -> None:
    with open(os.path.join(root, "commitlog", f"{pos - pos % seg:020d}"), "r+b") as f:
        f.seek(pos % seg)
        f.write(data)


@pytest.fixture
def store(tmp_path):
    root = tmp_path / "master"
    placed = write_plain_store(root, msgs(120))
    return str(root), placed


def test_recover_and_iterate_a_clean_store(store):
    root, placed = store
    with LegacyStore(root) as s:
        assert s.segment_size == SEG and len(s.files) >= 5
        rec = s.recover()
        end = placed[-1][0] + placed[-1][1]
        assert (rec.begin, rec.end, rec.records, rec.stop, rec.clean) == (0, end, 120, "end", True)
        got = []
        for view, res in s.batches():
            for i in range(res.n):
                r = res.record(i)
                got.append((r.phy_offset, r.size, s.topic_of(view, r), r.queue_id, r.queue_offset))
        expect = []
        seen: dict = {}
        for (pos, size), m in zip(placed, msgs(120)):
            q = seen[(m.topic, m.queue_id)] = seen.get((m.topic, m.queue_id), -1) + 1
            expect.append((pos, size, m.topic, m.queue_id, q))
        assert got == expect
        # Blank fillers close the segments: some records start a segment.
        assert any(pos % SEG == 0 for pos, _ in placed[1:])
        r = list(s.records())[7]
        decoded = M.decode(s.read(r.phy_offset, r.size), check_crc=True)
        assert decoded.body == msgs(8)[7].body and decoded.physical_offset == r.phy_offset
        assert r.tags_code == M.tags_code("t2")
        # The pure-Python scanner agrees with the native one.
    with LegacyStore(root, backend=D.PYTHON) as p, LegacyStore(root) as n:
        assert p.recover() == n.recover()
        assert [attrs_tuple(r) for r in p.records()] == [attrs_tuple(r) for r in n.records()]


def attrs_tuple(r):
    return (r.phy_offset, r.size, r.queue_id, r.queue_offset, r.tags_code, r.store_timestamp, r.topic_hash)


def test_torn_tail_and_bad_crc_end_the_log(tmp_path, store):
    root, placed = store
    pos, size = placed[-1]
    patch(root, pos + size // 2, bytes(size - size // 2))  # the last write was torn
    with LegacyStore(root) as s:
        rec = s.recover()
        assert (rec.end, rec.records, rec.stop, rec.data_after) == (pos, 119, "torn", False)
        assert len(list(s.records())) == 119
    pos, size = placed[100]
    patch(root, pos + size - 40, b"X")  # a flipped body byte: BODYCRC no longer matches
    with LegacyStore(root) as s:
        rec = s.recover()
        assert (rec.end, rec.records, rec.stop) == (pos, 100, "crc")
        assert s.recover(check_crc=False).stop == "torn"
    pos, _ = placed[50]
    patch(root, pos + 4, b"\0\0\0\1")  # bad magic mid-log, valid segments after it
    with LegacyStore(root) as s:
        rec = s.recover()
        assert (rec.end, rec.stop, rec.data_after) == (pos, "corrupt", True)
    # A record whose TOTALSIZE disagrees with its fields
    root2 = str(tmp_path / "other")
    placed2 = write_plain_store(root2, msgs(10))
    pos, size = placed2[9]
    patch(root2, pos, struct.pack(">i", size + 4))
    with LegacyStore(root2) as s:
        assert (s.recover().end, s.recover().stop) == (pos, "torn")


def test_blank_at_the_end_of_the_last_segment_and_missing_segment(tmp_path):
    root = str(tmp_path / "s")
    placed = write_plain_store(root, msgs(80))
    last = placed[-1][0] + placed[-1][1]
    assert last > 2 * SEG
    patch(root, last, M.encode_blank(SEG - last % SEG))
    with LegacyStore(root) as s:
        rec = s.recover()
        assert (rec.end, rec.stop, rec.records) == (last, "blank", 80)
    os.unlink(os.path.join(root, "commitlog", f"{SEG:020d}"))
    with LegacyStore(root) as s:
        rec = s.recover()
        assert (rec.end, rec.stop, rec.data_after) == (SEG, "gap", True)


def test_config_checkpoint_and_abort(store):
    root, _ = store
    cdir = os.path.join(root, "config")
    os.makedirs(cdir)
    with open(os.path.join(cdir, "consumerOffset.json"), "w") as f:
        f.write('{"offsetTable":{"TopicA@g":{0:12,1:7}}}')  # fastjson: unquoted integer keys
    with open(os.path.join(cdir, "topics.json"), "w") as f:
        f.write(json.dumps({"topicConfigTable": {"TopicA": {"readQueueNums": 4}}}))
    with open(os.path.join(cdir, "topics.json.bak"), "w") as f:
        f.write("not json")
    with open(os.path.join(cdir, "delayOffset.json"), "w") as f:
        f.write("")
    stock = struct.pack(">qqqqq", 1_700_000_000_123, 1_700_000_000_100, 1_700_000_000_050, 0, 4096)
    with open(os.path.join(root, "checkpoint"), "wb") as f:
        f.write(stock + bytes(4096 - len(stock)))
    with LegacyStore(root) as s:
        cfg = read_config_dir(root)
        assert cfg["consumerOffset"] == {"offsetTable": {"TopicA@g": {"0": 12, "1": 7}}}
        assert cfg["topics"]["topicConfigTable"]["TopicA"]["readQueueNums"] == 4
        assert cfg["delayOffset"] is None and set(cfg) == {"consumerOffset", "topics", "delayOffset"}
        cp = s.checkpoint()
        assert (cp.physic_msg_timestamp, cp.logics_msg_timestamp, cp.index_msg_timestamp) == \
            (1_700_000_000_123, 1_700_000_000_100, 1_700_000_000_050)
        assert cp.dispatched_phy_offset == -1  # a stock checkpoint has no ledgermq extension
        assert not s.abort_present
        open(os.path.join(root, "abort"), "w").close()
        assert s.abort_present
    with open(os.path.join(cdir, "subscriptionGroup.json"), "w") as f:
        f.write("{broken")
    with pytest.raises(ValueError, match="subscriptionGroup.json"):
        read_config_dir(root)


def test_compare_master_and_slaves(tmp_path, store):
    root, placed = store
    same = str(tmp_path / "same")
    write_plain_store(same, msgs(120))
    assert compare_commitlogs(root, same) is None
    lagging = str(tmp_path / "lagging")
    write_plain_store(lagging, msgs(90))
    assert compare_commitlogs(root, lagging) is None and compare_commitlogs(lagging, root) is None
    # A slave that took other messages from record 77 on (a split brain):
    # the records before are identical, record 77 is the first to differ.
    diverged = str(tmp_path / "diverged")
    write_plain_store(diverged, msgs(77) + msgs(43, 77, tag="x"))
    assert compare_commitlogs(root, diverged) == placed[77][0]
    assert compare_commitlogs(diverged, root) == placed[77][0]
    with LegacyStore(root) as a, LegacyStore(diverged) as b:
        assert compare_commitlogs(a, b) == placed[77][0]
    # A slave whose copy of record 30 is damaged recovers to just before it:
    # over what both hold validly they agree (it is a lagging slave).
    damaged = str(tmp_path / "damaged")
    write_plain_store(damaged, msgs(120))
    patch(damaged, placed[30][0] + placed[30][1] - 30, b"#")
    with LegacyStore(damaged) as d:
        assert (d.recovery.end, d.recovery.stop) == (placed[30][0], "crc")
        assert compare_commitlogs(root, d) is None
    # A difference in the BLANK area (not in any record) is reported at the BLANK.
    blanky = str(tmp_path / "blanky")
    write_plain_store(blanky, msgs(120))
    k = next(i for i in range(1, 120) if placed[i][0] % SEG == 0)
    blank_at = placed[k - 1][0] + placed[k - 1][1]
    patch(blanky, blank_at + 12, b"junk")
    assert compare_commitlogs(root, blanky) == blank_at


def run(*args):
    return CliRunner().invoke(cli, list(args))


def file_md5(path) -> str:
    with open(path, "rb") as f:
        return hashlib.md5(f.read()).hexdigest()


def test_md5_commitlog_plain_and_dledger(tmp_path, store):
    root, _ = store
    slave = str(tmp_path / "slave")
    write_plain_store(slave, msgs(120))
    res = run("md5Commitlog", "--store", root, "--last", "3", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    names = sorted(n for n in os.listdir(os.path.join(root, "commitlog")))[-3:]
    assert [f["name"] for f in out["files"]] == names
    assert [f["md5"] for f in out["files"]] == [file_md5(os.path.join(root, "commitlog", n)) for n in names]
    assert json.loads(run("md5Commitlog", "--store", slave, "--last", "3", "--json").output)["files"] == out["files"]
    text = run("md5Commitlog", "--store", root).output.splitlines()
    assert len(text) == 2 and text[-1].split()[:2] == [out["files"][-1]["md5"], names[-1]]
    # A DLedger store: dledger-<id>/data
    from tests.consumequeue.test_dispatch import leader_store
    dl, _ = leader_store(tmp_path / "dl", 50)
    dl.flush()
    data = os.path.join(dl.store_dir, "data")
    out = json.loads(run("md5Commitlog", "--store", str(tmp_path / "dl"), "--last", "1", "--json").output)
    last = sorted(os.listdir(data))[-1]
    assert out["dir"] == data and out["files"] == [{"name": last, "size": os.path.getsize(os.path.join(data, last)),
                                                    "md5": file_md5(os.path.join(data, last))}]
    dl.close()
    assert [d.name for d in md5_files(os.path.join(root, "commitlog"))] == \
        sorted(os.listdir(os.path.join(root, "commitlog")))
    # compareCommitlog
    assert run("compareCommitlog", "--store", root, "--other", slave).output.strip() == "same"
    write_plain_store(slave, msgs(60) + msgs(60, 60, tag="y"))
    res = run("compareCommitlog", "--store", root, "--other", slave, "--json")
    assert res.exit_code == 1 and json.loads(res.output)["firstDifference"] == store[1][60][0]
    res = run("md5Commitlog", "--store", str(tmp_path / "nothing"))
    assert res.exit_code == 3 and res.output.startswith("mqadmin: error:")
