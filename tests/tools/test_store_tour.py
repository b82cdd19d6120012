# The store tour (python -m tools.store_tour) runs end to end on real files.
import os

from tools import store_tour


def test_quickstart_tour(tmp_path, capsys):
    assert store_tour.main(["--dir", str(tmp_path), "--entries", "600"]) == 0
    out = capsys.readouterr().out
    assert "files byte-identical to the leader's: True" in out
    assert "recovery after a torn write: torn entry" in out and "log now ends at 598" in out
    assert "verifyStore n1: 599 entries, index 0..598, committed 598, 0 problems" in out
    assert sorted(os.listdir(tmp_path)) == ["dledger-n0", "dledger-n1"]
