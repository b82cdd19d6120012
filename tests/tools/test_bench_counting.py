# The raw consumer's record count (tools/bench/broker.py count_records): it
# walks a pull's body by TOTALSIZE and MAGICCODE only, so it must still
# refuse a body its records do not tile, and count V1 and V2 records alike.
import pytest

from consumequeue import record as M
from tools.bench.broker import count_records


def test_counts_the_records_of_a_body_and_refuses_what_they_do_not_tile():
    v1 = M.encode(M.MessageRecord("BenchTopic", b"x" * 1024, {"TAGS": "bench"}))
    v2 = M.encode(M.MessageRecord("T" * 300, b"y" * 10, {}))  # a topic past 255 bytes: MAGIC_V2
    assert M.parse_layout(v2, 0).magic == M.MAGIC_V2
    assert count_records(b"") == 0
    assert count_records(v1 * 5 + v2 + v1) == 7
    for bad in (v1[:-1], v1 + b"ab", v1 + b"\0" * 16, b"\0" * 8, v1[:4] + b"\0\0\0\0" + v1[8:]):
        with pytest.raises(ValueError):
            count_records(bad)
