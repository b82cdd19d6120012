import io
import json
import os
import struct

import pytest
from click.testing import CliRunner
from rich.console import Console

from consumequeue import record as M
from consumequeue.queue_offsets import QueueOffsetTable
from tests.consumequeue.test_dispatch import SMALL, clean_build, leader_store, open_store, tree
from tools.mqadmin import cli

FMT = ["--cq-file-size", "1000", "--index-slots", "101", "--index-items", "300"]


def run(*args):
    return CliRunner().invoke(cli, list(args))


@pytest.fixture
def store_root(tmp_path):
    store, _ = leader_store(tmp_path, 500)
    expected = clean_build(store, tmp_path / "clean")
    store.close()
    return tmp_path, expected


def test_rebuild_consume_queue_writes_what_dispatch_writes(store_root):
    root, expected = store_root
    res = run("rebuildConsumeQueue", "--store", str(root), "--json", *FMT)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["messages"] == 500 and out["committedIndex"] == 499 and out["queues"] == 4
    assert out["beginPos"] == 0 and out["endPos"] == out["bytes"] > 0
    assert tree(str(root)) == expected
    # Again, over existing (and damaged) files: the same result.
    os.unlink(root / "consumequeue" / "T" / "0" / f"{0:020d}")
    res = run("rebuildConsumeQueue", "--store", str(root), *FMT)
    assert res.exit_code == 0 and "4 consume queues" in res.output
    assert tree(str(root)) == expected


def test_verify_store_cq_clean_then_damaged(store_root):
    root, _ = store_root
    assert run("rebuildConsumeQueue", "--store", str(root), *FMT).exit_code == 0
    res = run("verifyStore", "--store", str(root), "--cq", "--json", *FMT)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["entries"] == 500 and out["consumeQueues"]["ok"]
    assert out["consumeQueues"]["unitsChecked"] == 500
    # Damage one unit (its size) and drop a queue's tail file.
    path = root / "consumequeue" / "U" / "1" / f"{0:020d}"
    with open(path, "r+b") as f:
        f.seek(3 * 20 + 8)
        f.write(struct.pack(">i", 7))
    res = run("verifyStore", "--store", str(root), "--cq", *FMT)
    assert res.exit_code == 1
    assert "consumequeue/U/1@3: unit" in res.output
    os.unlink(root / "consumequeue" / "T" / "2" / f"{1000:020d}")
    out = json.loads(run("verifyStore", "--store", str(root), "--cq", "--json", *FMT).output)
    assert any("consumequeue/T/2" in p and "missing" in p for p in out["consumeQueues"]["problems"])
    # Without --cq, verifyStore does not look at consume queues.
    assert run("verifyStore", "--store", str(root)).exit_code == 0


def test_verify_store_checks_the_message_inside_each_entry(tmp_path):
    store = open_store(tmp_path)
    table = QueueOffsetTable()
    store.add_append_hook(table.append_hook)
    good = M.encode(M.MessageRecord(topic="T", body=b"payload"))
    bad_crc = bytearray(good)
    bad_crc[8:12] = b"\x00\x00\x00\x01"  # BODYCRC; the entry CRC still covers it
    bad_len = bytearray(good)
    struct.pack_into(">i", bad_len, 0, len(good) - 1)
    store.append_leader([good, bytes(bad_crc), b"opaque non-message body", bytes(bad_len)], term=1)
    store.set_committed(3)
    store.close()
    res = run("verifyStore", "--store", str(tmp_path), "--json")
    assert res.exit_code == 1
    problems = [p["reason"] for p in json.loads(res.output)["problems"]]
    assert problems == ["entry 1: message: BODYCRC 0x00000001 != computed "
                        f"{M.masked_crc32(b'payload'):#010x}",
                        f"entry 3: message: TOTALSIZE {len(good) - 1} != body length {len(good)}"]
    # The message check is verifyStore's own default (no other command module
    # patches it in); an empty --body-check turns it off.
    from tools.mqadmin import store_cmds
    assert store_cmds.DEFAULT_BODY_CHECK == "consumequeue.record:check_entry_body"
    assert run("verifyStore", "--store", str(tmp_path), "--body-check", "").exit_code == 0


def test_verify_cq_reports_queue_offset_holes(tmp_path):
    store = open_store(tmp_path)
    table = QueueOffsetTable()
    store.add_append_hook(table.append_hook)
    store.append_leader([M.encode(M.MessageRecord(topic="T", body=b"a"))] * 3, term=1)
    table.assign("T", 0, 4)  # a leader bug: offsets 3..6 never used
    store.append_leader([M.encode(M.MessageRecord(topic="T", body=b"b"))], term=1)
    store.set_committed(3)
    store.close()
    assert run("rebuildConsumeQueue", "--store", str(tmp_path), *FMT).exit_code == 0
    res = run("verifyStore", "--store", str(tmp_path), "--cq", *FMT)
    assert res.exit_code == 1
    assert "consumequeue/T/0@7: queue offset 7 follows 2 in log order" in res.output


def test_errors_are_one_line(tmp_path):
    res = run("rebuildConsumeQueue", "--store", str(tmp_path))
    assert res.exit_code == 3 and "no dledger-<selfId> directory" in res.output
    assert run("rebuildConsumeQueue").exit_code == 2
    res = run("rebuildConsumeQueue", "--store", str(tmp_path), "--cq-file-size", "30")
    assert res.exit_code == 2 and "multiple of 20" in res.output
    res = run("verifyStore", "--store", str(tmp_path), "--cq", "--cq-file-size", "30")
    assert res.exit_code == 2 and "multiple of 20" in res.output


def test_rebuild_refuses_a_store_in_use(tmp_path):
    store, _ = leader_store(tmp_path, 10)  # holds the store lock, like a running broker
    try:
        res = run("rebuildConsumeQueue", "--store", str(tmp_path), *FMT)
        assert res.exit_code == 3 and "mqadmin: error:" in res.output
    finally:
        store.close()


def test_progress_bar_reports_bytes():
    from tools.mqadmin.cq_cmds import _progress

    with _progress(False, 10) as cb:
        assert cb is None
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    with _progress(True, 1 << 30, console) as cb:
        cb(1 << 29, 1 << 30)
    text = out.getvalue()
    assert "rebuilding" in text and "0.5/1.0 GiB" in text


def test_small_config_matches_test_helpers():
    # The FMT options above must describe the SMALL config the helpers use.
    assert (SMALL.cq_file_size, SMALL.index_slot_num, SMALL.index_num) == (1000, 101, 300)
