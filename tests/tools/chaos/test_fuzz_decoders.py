# The decoders that read bytes from outside, fuzzed in process (issue 14):
# the broker/name server remoting decoder, the peer frame decoder with the
# HELLO and Raft message decoders behind it, and the stored message record
# decoder.  Two drivers over the same targets (tools/chaos/fuzz.py): the
# seeded mutation fuzzer with a fixed input budget per target (figures
# printed), and hypothesis choosing the mutations (so a failure shrinks to a
# small input).  Set LEDGERMQ_FUZZ_INPUTS for a longer run; the long run
# is `python -m tools.chaos.fuzz --seconds N`.
import os
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tools.chaos.fuzz import TARGETS, fuzz, inputs

BUDGET = int(os.environ.get("LEDGERMQ_FUZZ_INPUTS", "20000"))


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_mutation_fuzz_budget(target):
    report = fuzz(target, seed=1414, max_inputs=BUDGET)
    print(f"{target}: {report.inputs} inputs, {report.accepted} decoded, {report.rejected} refused")
    assert report.inputs == BUDGET
    # The corpus and mutations reach both outcomes: a fuzzer that only ever
    # produced garbage (or only valid inputs) would test nothing.
    assert report.accepted > BUDGET // 50 and report.rejected > BUDGET // 50


@pytest.mark.parametrize("target", sorted(TARGETS))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rng=st.randoms(use_true_random=False))
def test_hypothesis_chosen_mutations(target, rng):
    corpus_fn, check = TARGETS[target]
    data = next(inputs(rng, corpus_fn()))
    assert check(random.Random(0), data) in ("ok", "error")
