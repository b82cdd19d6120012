# The commit index as the quorum median of match indexes, against a naive
# oracle: the largest index that at least a majority of replicas hold.
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commitlog.raft.quorum import majority, quorum_match_index


def naive_quorum_index(matches):
    best = -1
    for candidate in set(matches):
        if sum(m >= candidate for m in matches) * 2 > len(matches) and candidate > best:
            best = candidate
    return best


@settings(deadline=None)
@given(st.lists(st.integers(min_value=-1, max_value=50), min_size=1, max_size=9))
def test_quorum_median_matches_naive_oracle(matches):
    assert quorum_match_index(matches) == naive_quorum_index(matches)


@settings(deadline=None)
@given(st.lists(st.integers(min_value=-1, max_value=1000), min_size=1, max_size=9))
def test_quorum_index_is_held_by_a_majority_and_order_free(matches):
    q = quorum_match_index(matches)
    assert sum(m >= q for m in matches) >= majority(len(matches))
    assert quorum_match_index(list(reversed(matches))) == q


def test_majority_sizes():
    assert [majority(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]
    with pytest.raises(ValueError):
        majority(0)
    # 3 replicas: leader at 10, one follower at 7, one at -1 -> 7 is committed
    assert quorum_match_index([10, 7, -1]) == 7
    # 4 replicas need 3: 10, 9, 3, 2 -> 3
    assert quorum_match_index([10, 2, 9, 3]) == 3
