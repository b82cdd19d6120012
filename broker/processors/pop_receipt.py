# Owns the POP receipt (RocketMQ's ExtraInfoUtil / POP_CK property) and the
# names POP consumption derives from a topic and a group (KeyBuilder):
#
#   POP_CK  "ckQueueOffset popTime invisibleTime reviveQid topicType
#            brokerName queueId queueOffset"  (space-separated, the first 8
#            fields; the gRPC proxy appends " commitLogOffset" and hands the
#            string to clients as receipt_handle: a 9th field is accepted and
#            kept).  topicType: "0" a normal topic, "1" the V1 POP retry
#            topic %RETRY%group_topic, "2" the V2 one %RETRY%group+topic.
#            reviveQid 999 (KeyBuilder.POP_ORDER_REVIVE_QUEUE) marks an order
#            pop's receipt.
#
# A receipt decodes only when it has 8 or 9 fields, each number a Java long
# (int for reviveQid and queueId), none negative (popTime, invisibleTime,
# offsets), and a broker name of at most 255 characters: anything else is
# an "invalid receipt" (ReceiptError), answered INVALID_PARAMETER by the
# processors, never an exception further up.
#
# Also the rewrite of a message that goes back (revived: an expired
# ordinary pop, to the retry topic or the DLQ; a FIFO message past its
# attempts, to the DLQ): body, flag, sysflag, born fields and properties
# kept, RETRY_TOPIC = the original topic, ORIGIN_MESSAGE_ID set once,
# reconsumeTimes + 1, POP_CK and DELAY dropped.  Pure.
import attrs

from broker.common.msgid import offset_msg_id
from broker.metadata.pop import ORDER_REVIVE_QID
from broker.processors.retry import PROPERTY_ORIGIN_MESSAGE_ID, PROPERTY_RETRY_TOPIC, dlq_topic
from consumequeue import record as M

RETRY_PREFIX = "%RETRY%"
TOPIC_NORMAL, TOPIC_RETRY_V1, TOPIC_RETRY_V2 = "0", "1", "2"
MAX_RECEIPT_LEN = 1024
_MAX_LONG = (1 << 63) - 1
_MAX_INT = (1 << 31) - 1


class ReceiptError(ValueError):
    """A POP_CK / extraInfo that is not a receipt this broker could have written."""


def pop_retry_topic(topic: str, group: str) -> str:
    """KeyBuilder.buildPopRetryTopicV1: where a POP consumer's unacked
    messages of `topic` go back (one retry topic per topic and group)."""
    return f"{RETRY_PREFIX}{group}_{topic}"


def topic_type(topic: str) -> str:
    """ExtraInfoUtil.getRetry: the receipt's topicType of a popped topic."""
    if topic.startswith(RETRY_PREFIX):
        return TOPIC_RETRY_V2 if "+" in topic else TOPIC_RETRY_V1
    return TOPIC_NORMAL


def real_topic(topic: str, group: str, ttype: str) -> str:
    """ExtraInfoUtil.getRealTopic: the topic a receipt's message is stored on."""
    if ttype == TOPIC_RETRY_V1:
        return pop_retry_topic(topic, group)
    if ttype == TOPIC_RETRY_V2:
        return f"{RETRY_PREFIX}{group}+{topic}"
    return topic


@attrs.frozen(kw_only=True)
class Receipt:
    ck_queue_offset: int
    pop_time: int
    invisible_time: int
    revive_qid: int
    topic_type: str
    broker_name: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int | None = None  # the proxy's 9th field

    @property
    def order(self) -> bool:
        return self.revive_qid == ORDER_REVIVE_QID

    @property
    def deadline(self) -> int:
        return self.pop_time + self.invisible_time

    def __str__(self) -> str:
        text = (f"{self.ck_queue_offset} {self.pop_time} {self.invisible_time} {self.revive_qid} "
                f"{self.topic_type} {self.broker_name} {self.queue_id} {self.queue_offset}")
        return text if self.commit_log_offset is None else f"{text} {self.commit_log_offset}"


def _num(text: str, what: str, hi: int) -> int:
    if not text or len(text) > 20 or not (text.isdigit() and text.isascii()) or (len(text) > 1 and text[0] == "0"):
        raise ReceiptError(f"invalid receipt: {what} {text[:24]!r} is not a number")
    value = int(text)
    if value > hi:
        raise ReceiptError(f"invalid receipt: {what} {value} is out of range")
    return value


def parse_receipt(text) -> Receipt:
    """The receipt in an ACK/CHANGE_INVISIBLE extraInfo or a POP_CK property."""
    if not isinstance(text, str) or len(text) > MAX_RECEIPT_LEN:
        raise ReceiptError("invalid receipt: missing or longer than 1024 characters")
    parts = text.split(" ")
    if len(parts) not in (8, 9):
        raise ReceiptError(f"invalid receipt: {len(parts)} fields, expected 8 "
                           "(ckQueueOffset popTime invisibleTime reviveQid topicType brokerName queueId queueOffset)")
    if parts[4] not in (TOPIC_NORMAL, TOPIC_RETRY_V1, TOPIC_RETRY_V2):
        raise ReceiptError(f"invalid receipt: topic type {parts[4][:8]!r} is not 0, 1 or 2")
    if not 0 < len(parts[5]) <= 255:
        raise ReceiptError("invalid receipt: bad broker name")
    return Receipt(ck_queue_offset=_num(parts[0], "ckQueueOffset", _MAX_LONG),
                   pop_time=_num(parts[1], "popTime", _MAX_LONG),
                   invisible_time=_num(parts[2], "invisibleTime", _MAX_LONG),
                   revive_qid=_num(parts[3], "reviveQid", _MAX_INT), topic_type=parts[4],
                   broker_name=parts[5], queue_id=_num(parts[6], "queueId", _MAX_INT),
                   queue_offset=_num(parts[7], "queueOffset", _MAX_LONG),
                   commit_log_offset=_num(parts[8], "commitLogOffset", _MAX_LONG) if len(parts) == 9 else None)


def offset_info(parts: list[tuple[str, int, object]]) -> str:
    """startOffsetInfo / msgOffsetInfo / orderCountInfo of a POP response:
    "topicType queueId value" joined by ";" (a list value joined by ",")."""
    out = []
    for ttype, queue_id, value in parts:
        if isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        out.append(f"{ttype} {queue_id} {value}")
    return ";".join(out)


def decode_bitset(data: bytes, limit: int = 4096) -> list[int]:
    """java.util.BitSet.valueOf(byte[]) -> the set bit indexes (little-endian
    bytes, least significant bit first), at most `limit` bytes."""
    if len(data) > limit:
        raise ReceiptError(f"invalid batch ack: a bit set of {len(data)} bytes (at most {limit})")
    return [i * 8 + b for i, byte in enumerate(data) for b in range(8) if byte >> b & 1]


def original_topic(ck_topic: str, group: str) -> str:
    """The normal topic a checkpoint's messages belong to."""
    prefix = f"{RETRY_PREFIX}{group}_"
    return ck_topic[len(prefix):] if ck_topic.startswith(prefix) else ck_topic


def revived(rec: M.MessageRecord, phy: int, topic: str, *, to_dlq: bool, group: str, now_ms: int,
            store_host: M.HostAddr) -> M.MessageRecord:
    """The pure rewrite of one unacked message (see the header)."""
    props = dict(rec.properties)
    props.setdefault(PROPERTY_RETRY_TOPIC, topic)
    props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, offset_msg_id(rec.store_host, phy))
    props.pop(M.PROPERTY_DELAY, None)
    props.pop("POP_CK", None)
    target = dlq_topic(group) if to_dlq else pop_retry_topic(topic, group)
    return M.MessageRecord(topic=target, body=rec.body, properties=props, queue_id=0, flag=rec.flag,
                           sysflag=rec.sysflag, born_timestamp=rec.born_timestamp, born_host=rec.born_host,
                           store_timestamp=now_ms, store_host=store_host, reconsume_times=rec.reconsume_times + 1)
