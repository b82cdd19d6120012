# Owns the send path's native half: the usual SEND_MESSAGE_V2 -- a RawSend
# whose header the decoder's scanner parsed in C -- checked here with a few
# integer tests, its record and its answer encoded in C a run at a time
# (native/sendpath.py).  A request that does not pass every check goes down
# the general path (send.py) unchanged, so refusals are decided and worded
# in one place, and the general path is the oracle the native one is tested
# against (tests/broker/processors/test_send_native.py).
#
# What a run costs in Python per message: a topic lookup, the queue-id,
# body-size and transaction checks, the sysflag's MULTI_TAG and IPv6 bits,
# and a slice for its record and one for its answer.
from array import array
from collections.abc import Callable

import attrs

from broker.common.permissions import PERM_WRITE
from broker.remoting.codec import RawSend
from broker.remoting.codes import CURRENT_VERSION
from consumequeue import record as M
from native import ffi, sendpath

_V6_FLAGS = M.BORNHOST_V6_FLAG | M.STOREHOST_V6_FLAG
_MAX_TOPICS = 4096


@attrs.define(eq=False)
class NativeRun:
    """Consecutive RawSends of one scan taken by the native path, in burst
    order; encode() turns them into records."""

    scan: sendpath.SendScan
    at: list[int] = attrs.Factory(list)  # their places in the burst
    which: array = attrs.Factory(lambda: array("i"))  # their frames in the scan
    queue_ids: array = attrs.Factory(lambda: array("i"))
    sysflags: array = attrs.Factory(lambda: array("i"))
    opaques: array = attrs.Factory(lambda: array("i"))
    oneway: list[bool] = attrs.Factory(list)
    missing_uniq: int = 0
    # the topic of the last message taken (its first request in the scan,
    # the scanner's topic_first), and take()'s checks for it
    topic_first: int = -1
    verdict: tuple | None = None
    cluster_props: int = 0  # properties bytes every record gets (CLUSTER)
    uniq_props: int = 0  # and a record gets when its UNIQ_KEY is made here
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

    def take(self, proc, run: NativeRun, at: int, raw: RawSend, born_v6: bool) -> bool:
        """Add `raw` to `run` if it passes every check the general path
        would make of it (False: let the general path serve it)."""
        r = raw.scan.reqs[raw.index]
        if r.status != sendpath.SEND_OK:  # pragma: no cover - the decoder hands out only these
            return False
        first = r.topic_first  # the scanner's: equal means the same topic bytes
        if first != run.topic_first:  # a run is usually one topic: its checks are looked up once
            verdict = self._verdict(proc, ffi.buffer(raw.scan.scratch + r.topic_off, r.topic_len)[:], born_v6)
            if verdict is None:
                return False
            run.topic_first, run.verdict = first, verdict
        write_queues, read_queues, max_size, set_flags = run.verdict
        queue_id = r.queue_id
        if queue_id >= write_queues and queue_id >= read_queues:
            return False
        if r.body_len > max_size:
            return False
        sysflag = r.sysflag
        if sysflag & M.TRANSACTION_MASK == M.TRANSACTION_PREPARED_TYPE:
            return False
        if r.props_len + run.cluster_props + (0 if r.uniq_len else run.uniq_props) > M.MAX_PROPERTIES_LEN:
            return False
        run.at.append(at)
        run.which.append(raw.index)
        run.queue_ids.append(queue_id)
        run.sysflags.append((sysflag & ~_V6_FLAGS) | set_flags)
        run.opaques.append(raw.opaque)
        run.oneway.append(raw.is_oneway)
        if not r.uniq_len:
            run.missing_uniq += 1
        return True

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
        flags = (M.MULTI_TAGS_FLAG if cfg.topic_filter_type == "MULTI_TAG" else 0) | \
            (M.BORNHOST_V6_FLAG if born_v6 else 0) | (M.STOREHOST_V6_FLAG if bcfg.store_host.is_v6 else 0)
        return cfg.write_queue_nums, cfg.read_queue_nums, bcfg.max_message_size, flags

    def _validated(self, key: bytes) -> str | None:
        topic = key.decode("utf-8")
        if not self.valid(topic):
            return None
        if len(self.topics) >= _MAX_TOPICS:
            self.topics.clear()
        self.topics[key] = topic
        return topic


def new_run(scan: sendpath.SendScan, cluster: bytes, uniq_prefix: str) -> NativeRun:
    return NativeRun(scan, cluster_props=9 + len(cluster), uniq_props=9 + len(uniq_prefix) + 13)


def encode(run: NativeRun, records: list, born_host: bytes, store_host: bytes, store_timestamp: int,
           cluster: bytes, uniq_keys) -> None:
    """The run's records, appended to `records`: views of one buffer (the
    log copies them once, into its write)."""
    diff, counter = uniq_keys.reserve(run.missing_uniq) if run.missing_uniq else (0, 0)
    env = sendpath.SendEnv(born_host, store_host, store_timestamp, cluster, uniq_keys.prefix.encode(), diff,
                           counter)
    buf, rec_off, rec_len, run.uniq_off, run.uniq_len, _ = sendpath.encode_sends(
        run.scan, run.which, run.queue_ids, run.sysflags, env)
    run.first, run.records = len(records), buf
    view = memoryview(buf)
    records.extend([view[o:o + n] for o, n in zip(rec_off, rec_len)])


def answer(run: NativeRun, replies: list, placed, stamps, store_host: bytes) -> bool:
    """SUCCESS answers of a committed run into `replies` (False, nothing
    done, when the stamps are missing: the caller answers the slow way)."""
    n = len(run.at)
    first = run.first
    if stamps is None:
        return False
    queue_offsets = array("q", stamps[first:first + n])
    if min(queue_offsets) < 0:
        return False
    phy = array("q", [pos + 48 for _, pos in placed[first:first + n]])
    frames, offs = sendpath.encode_send_responses(run.opaques, run.queue_ids, queue_offsets, phy, run.records,
                                                  run.uniq_off, run.uniq_len, store_host, CURRENT_VERSION)
    offs.append(len(frames))
    for k, at in enumerate(run.at):
        if not run.oneway[k]:
            replies[at] = frames[offs[k]:offs[k + 1]]
    return True


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
