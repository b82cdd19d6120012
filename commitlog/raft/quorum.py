# Owns the quorum arithmetic: majority size and the committed index as the
# quorum median of match indexes.  Pure functions (hypothesis-tested against a
# naive oracle in tests/commitlog/raft/test_quorum.py).
from typing import Iterable


def majority(voters: int) -> int:
    if voters < 1:
        raise ValueError("a group needs at least one voter")
    return voters // 2 + 1


def quorum_match_index(match_indexes: Iterable[int]) -> int:
    """The highest index that a majority of replicas hold: the majority-th
    largest match index (the median for odd groups).  The leader's own entry
    is its persisted end index."""
    ordered = sorted(match_indexes, reverse=True)
    return ordered[majority(len(ordered)) - 1]
