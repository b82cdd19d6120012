# Owns the send path's native half: runs of the usual SEND_MESSAGE_V2 --
# a codec.SendRun, consecutive requests whose headers the decoder's scanner
# parsed in C -- checked (each topic once in Python, then every message in
# C: lmq_take_sends), their records and their answers encoded in C a run at
# a time (native/sendpath.py).  A request that does not pass every check
# goes down the general path (send.py) unchanged, so refusals are decided
# and worded in one place, and the general path is the oracle the native
# one is tested against (tests/broker/processors/test_send_native.py).
#
# What a run costs in Python per message: a slice for its record (the log
# takes a list of bodies) and the position of its entry for its answer.
from array import array
from collections.abc import Callable

import attrs

from broker.common.permissions import PERM_WRITE
from broker.remoting.codec import SendRun
from broker.remoting.codes import CURRENT_VERSION, RPC_ONEWAY
from consumequeue import record as M
from native import sendpath

_V6_FLAGS = M.BORNHOST_V6_FLAG | M.STOREHOST_V6_FLAG
_MAX_TOPICS = 4096


@attrs.define(eq=False)
class NativeRun:
    """Requests of one SendRun the native path took: consecutive frames of
    its scan, `k0` requests into the SendRun at place `item` of the burst,
    in the arrays' first n slots; encode() turns them into records."""

    scan: sendpath.SendScan
    item: int
    k0: int
    which: array  # their frames in the scan
    queue_ids: array
    sysflags: array
    opaques: array
    n: int = 0
    counts: array = attrs.Factory(lambda: array("q", [0, 0]))  # UNIQ_KEYs to make, oneway requests
    # set by encode():
    first: int = -1  # index of the run's first record among the burst's
    records: bytearray | None = None
    uniq_off: array | None = None
    uniq_len: array | None = None


@attrs.define(eq=False)
class NativeSends:
    """The native path's state in one send processor: topic names that
    passed `valid` (the general path's check), by their UTF-8 bytes."""

    valid: Callable[[str], bool]
    topics: dict[bytes, str] = attrs.Factory(dict)

    def take(self, proc, sends: SendRun, lo: int, item: int, born_v6: bool, rules: dict,
             props_fixed: int, props_uniq: int) -> tuple[NativeRun | None, int]:
        """Take the requests of `sends` from frame `lo` on while each passes
        every check the general path would make of it (lmq_take_sends, one
        topic's checks at a time; `rules` caches them for the burst by
        (scan, topic_first)).  Returns the run taken (None: nothing) and the
        first frame not taken (sends.hi when all were): the general path
        serves that one."""
        scan, hi = sends.scan, sends.hi
        reqs = scan.reqs
        run = None
        i = lo
        while i < hi:
            first = reqs[i].topic_first
            key = (id(scan), first)
            rule = rules.get(key, False)
            if rule is False:
                rule = rules[key] = self._rule(proc, scan, first, born_v6, props_fixed, props_uniq)
            if rule is None:
                break
            if run is None:
                cap = hi - i
                run = NativeRun(scan, item, i - sends.lo, array("i", bytes(4 * cap)), array("i", bytes(4 * cap)),
                                array("i", bytes(4 * cap)), array("i", bytes(4 * cap)))
            i, why = sendpath.take_sends(scan, i, hi, rule, run.which, run.queue_ids, run.sysflags, run.opaques,
                                         run.n, run.counts)
            run.n = i - sends.lo - run.k0
            if why != sendpath.TAKE_TOPIC:
                break
        return (run if run is not None and run.n else None), i

    def _rule(self, proc, scan: sendpath.SendScan, first: int, born_v6: bool, props_fixed: int, props_uniq: int):
        verdict = self._verdict(proc, scan.topic(first), born_v6)
        if verdict is None:
            return None
        write_queues, read_queues, max_size, set_flags = verdict
        return sendpath.take_rule(first, max(write_queues, read_queues), max_size, set_flags, _V6_FLAGS,
                                  props_fixed, props_uniq, M.MAX_PROPERTIES_LEN)

    def _verdict(self, proc, key: bytes, born_v6: bool) -> tuple | None:
        """What take() checks a message of topic `key` against: (write
        queues, read queues, max body size, sysflag bits set), or None when
        the general path must serve the topic (invalid name, auto-create,
        no write permission)."""
        topic = self.topics.get(key)
        if topic is None:
            topic = self._validated(key)
            if topic is None:
                return None
        cfg = proc.metadata.topic_config(topic)
        if cfg is None or not cfg.perm & PERM_WRITE:
            return None  # auto-create first, or refused: the general path says which
        bcfg = proc.cfg
        flags = M.host_flags(M.MULTI_TAGS_FLAG if cfg.topic_filter_type == "MULTI_TAG" else 0, born_v6,
                             bcfg.store_host.is_v6)
        return cfg.write_queue_nums, cfg.read_queue_nums, bcfg.max_message_size, flags

    def _validated(self, key: bytes) -> str | None:
        topic = key.decode("utf-8")
        if not self.valid(topic):
            return None
        if len(self.topics) >= _MAX_TOPICS:
            self.topics.clear()
        self.topics[key] = topic
        return topic


def props_room(cluster: bytes, uniq_prefix: str) -> tuple[int, int]:
    """Properties bytes every record gets (CLUSTER), and a record gets when
    its UNIQ_KEY is made here."""
    return 9 + len(cluster), 9 + len(uniq_prefix) + 13


def encode(run: NativeRun, records: list, born_host: bytes, store_host: bytes, store_timestamp: int,
           cluster: bytes, uniq_keys) -> None:
    """The run's records, appended to `records`: views of one buffer (the
    log copies them once, into its write)."""
    missing = run.counts[0]
    diff, counter = uniq_keys.reserve(missing) if missing else (0, 0)
    env = sendpath.SendEnv(born_host, store_host, store_timestamp, cluster, uniq_keys.prefix.encode(), diff,
                           counter)
    buf, rec_off, rec_len, run.uniq_off, run.uniq_len, _ = sendpath.encode_sends(
        run.scan, run.which, run.queue_ids, run.sysflags, env, run.n)
    run.first, run.records = len(records), buf
    view = memoryview(buf)
    records.extend([view[o:o + n] for o, n in zip(rec_off[:run.n], rec_len)])


def answer(run: NativeRun, sends: SendRun, replies: list, placed, stamps, store_host: bytes) -> bool:
    """SUCCESS answers of a committed run: replies[run.item] becomes all of
    the SendRun's answers in one bytes object when the run is all of it and
    none is oneway, else a list of answers by request (None for a oneway
    one).  False, nothing done, when the stamps are missing: the caller
    answers the slow way."""
    n, first = run.n, run.first
    if stamps is None:
        return False
    queue_offsets = array("q", stamps[first:first + n])
    if min(queue_offsets) < 0:
        return False
    phy = array("q", [pos + 48 for _, pos in placed[first:first + n]])
    frames, offs = sendpath.encode_send_responses(run.opaques, run.queue_ids, queue_offsets, phy, run.records,
                                                  run.uniq_off, run.uniq_len, store_host, CURRENT_VERSION, n)
    if n == len(sends) and not run.counts[1]:
        replies[run.item] = frames
        return True
    offs.append(len(frames))
    out = run_replies(replies, run.item, sends)
    reqs = run.scan.reqs
    for k in range(n):
        if not reqs[run.which[k]].flag & RPC_ONEWAY:
            out[run.k0 + k] = frames[offs[k]:offs[k + 1]]
    return True


def run_replies(replies: list, item: int, sends: SendRun) -> list:
    """The list of answers by request of the SendRun at replies[item]."""
    out = replies[item]
    if out is None:
        out = replies[item] = [None] * len(sends)
    return out


def batch_records(body: bytes, topic: bytes, magic: int, queue_id: int, sysflag: int, born_timestamp: int,
                  reconsume_times: int, born_host: bytes, store_host: bytes, store_timestamp: int, cluster: bytes,
                  uniq_keys) -> list[bytes] | None:
    """A SEND_BATCH's records built in C when every message in it is plain
    (sendpath.scan_batch), else None: the general path builds it."""
    if not sendpath.BATCH_AVAILABLE:
        return None
    scanned = sendpath.scan_batch(body)
    if scanned is None:
        return None
    missing = scanned[2]
    diff, counter = uniq_keys.reserve(missing) if missing else (0, 0)
    env = sendpath.SendEnv(born_host, store_host, store_timestamp, cluster, uniq_keys.prefix.encode(), diff, counter)
    return sendpath.encode_batch(body, scanned, topic, magic, queue_id, sysflag, born_timestamp, reconsume_times, env)
