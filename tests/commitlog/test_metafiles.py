# currterm / checkpoint / ledgermq-base: DLedger's Java-properties text,
# atomic replacement, tolerance of DLedger's .bak leftovers.
import os

import pytest

from commitlog import metafiles as M
from commitlog.errors import CorruptStoreError


def test_currterm_round_trip_and_exact_text(tmp_path):
    assert M.read_currterm(str(tmp_path)) == (0, None)  # a fresh member
    M.write_currterm(str(tmp_path), 7, "n2")
    assert (tmp_path / "currterm").read_text() == "currTerm=7\nvoteLeader=n2\n"
    assert M.read_currterm(str(tmp_path)) == (7, "n2")
    M.write_currterm(str(tmp_path), 8, None)
    assert (tmp_path / "currterm").read_text() == "currTerm=8\nvoteLeader=\n"
    assert M.read_currterm(str(tmp_path)) == (8, None)
    assert sorted(os.listdir(tmp_path)) == ["currterm"]  # no tmp file left behind


def test_checkpoint_round_trip(tmp_path):
    assert M.read_checkpoint(str(tmp_path)) == (-1, -1)
    M.write_checkpoint(str(tmp_path), 1234, 1200)
    assert (tmp_path / "checkpoint").read_text() == "endIndex=1234\ncommittedIndex=1200\n"
    assert M.read_checkpoint(str(tmp_path)) == (1234, 1200)


def test_reads_what_java_properties_writers_produce(tmp_path):
    (tmp_path / "checkpoint").write_text(
        "#Tue Mar 05 10:00:00 CST 2024\n! another comment\n\n  committedIndex : 41\nendIndex=42\r\n")
    assert M.read_checkpoint(str(tmp_path)) == (42, 41)
    (tmp_path / "currterm").write_text("voteLeader\\u003dx=n\\u0031\ncurrTerm=3\\\n  4\n")
    props = M.read_properties(str(tmp_path / "currterm"))
    assert props == {"voteLeader=x": "n1", "currTerm": "34"}


def test_tolerates_dledger_bak_leftovers_and_stale_tmp(tmp_path):
    # DLedger's safe write: tmp written, old copied to .bak, file deleted, tmp renamed.
    # Crashing after the delete leaves only .bak (and the tmp): read the .bak.
    (tmp_path / "currterm.bak").write_text("currTerm=5\nvoteLeader=n1\n")
    (tmp_path / "currterm.tmp").write_text("currTerm=6\nvote")
    assert M.read_currterm(str(tmp_path)) == (5, "n1")
    M.write_currterm(str(tmp_path), 6, "n0")
    assert M.read_currterm(str(tmp_path)) == (6, "n0")  # the real file wins over .bak
    assert not (tmp_path / "currterm.tmp").exists()


def test_garbage_values_are_reported_with_the_file(tmp_path):
    (tmp_path / "checkpoint").write_text("endIndex=abc\ncommittedIndex=1\n")
    with pytest.raises(CorruptStoreError, match="endIndex='abc'") as info:
        M.read_checkpoint(str(tmp_path))
    assert info.value.path.endswith("checkpoint")


def test_base_record(tmp_path):
    assert M.read_base(str(tmp_path)) is None
    M.write_base(str(tmp_path), M.StoreBase(index=100, pos=5000, prev_term=3, prev_chain_crc=0xFFFFFFFF))
    assert M.read_base(str(tmp_path)) == M.StoreBase(index=100, pos=5000, prev_term=3, prev_chain_crc=0xFFFFFFFF)
    M.remove_base(str(tmp_path))
    assert M.read_base(str(tmp_path)) is None


def test_values_needing_escapes_are_refused(tmp_path):
    with pytest.raises(ValueError):
        M.write_currterm(str(tmp_path), 1, "bad\nid")
