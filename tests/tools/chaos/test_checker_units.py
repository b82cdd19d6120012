# The checker's arithmetic on its own (tools/chaos/checker.py): the
# unavailability window of a fault, the classification of client errors,
# and what the soak judges bounded.
import math

import broker.client as client
from tools.chaos.checker import unavailability
from tools.chaos.nemesis import Fault
from tools.chaos.workload import _classify


def test_window_is_the_longest_gap_from_the_fault_to_the_first_ack_after_heal():
    f = Fault("kill", "kill -9 n0", start=10.0, healed=13.0)
    acks = [1.0, 9.9, 10.2, 12.5, 12.6, 13.4, 20.0]
    [(fault, window)] = unavailability([f], acks)
    assert fault is f and window == 12.5 - 10.2     # the gap inside; 13.4 ends it
    [(_, none_after)] = unavailability([Fault("pause", "x", 30.0, 31.0)], acks)
    assert none_after == math.inf                   # no SEND_OK after the heal: a stall
    [(_, first)] = unavailability([Fault("slow", "x", 5.0, 6.0)], [1.0, 9.0])
    assert first == 4.0                             # measured from the fault, not the last ack before it


def test_only_refusals_that_prove_nothing_was_appended_count_as_refused():
    not_leader = client.BrokerUnavailableError("a", 14, "broker b/n1 is not the DLedger leader (master); ...")
    term_changed = client.BrokerUnavailableError("a", 14, "service not available now: term changed from 3 to 4")
    timeout = client.RequestTimeoutError("a", "no response in 3 s")
    disk = client.BrokerUnavailableError("a", 14, "service not available now: disk holding /x is 96% full; "
                                                  "writes refused")
    assert _classify(client.SendFailedError("T", [not_leader, client.NoRouteError("T")])) == "refused"
    assert _classify(client.SendFailedError("T", [disk])) == "refused"
    assert _classify(client.SendFailedError("T", [not_leader, timeout])) == "unknown"
    assert _classify(client.SendFailedError("T", [term_changed])) == "unknown"  # may still commit


def test_redelivery_bound_counts_what_can_be_in_flight_around_each_fault():
    from tools.chaos.checker import PULL_BATCH, redelivery_bound
    from tools.chaos.workload import QUEUES, History

    h = History(0.0)
    h.ack_times = [0.5, 1.0, 8.0, 9.5, 9.9]
    faults = [Fault("kill", "x", start=10.0, healed=12.0)]
    per_fault = QUEUES * PULL_BATCH * 2
    # fault at 10: acks in [7, 10] = 3; the check's own restart at 9.9: acks in [6.9, 9.9] = 3
    assert redelivery_bound(faults, h, duplicates=5) == 5 + 3 + per_fault + 3 + per_fault


def test_soak_judges_descriptors_other_than_store_files():
    """The store keeps a descriptor per segment and index file, so the total
    grows with the data kept (a 30-minute soak at ~130 SEND_OK/s went from
    54 to 83); only the other descriptors (sockets, pipes) are judged."""
    from tools.chaos.soak import Sample, bounded

    def run(other_growth: int) -> list[Sample]:
        return [Sample(60 + i, 1.0, 1.0, 1.0, {"n0": 1}, {"n0": 40 + 4 * i + other_growth * i}, {"n0": 1},
                       {"n0": 30 + 4 * i}) for i in range(20)]
    assert bounded(run(0), "fds") and not bounded(run(0), "other_fds")
    assert bounded(run(2), "other_fds") == ["n0: other_fds grew from a peak of 16 early to 48 at the end"]
