# Owns consumer retry (RocketMQ's SendMessageProcessor.consumerSendMsgBack)
# and the retry/DLQ topics and subscription groups it needs:
#
#   CONSUMER_SEND_MSG_BACK 36  header offset (commitlog physical offset of
#        the message the consumer failed on), group, delayLevel, and the
#        optional originMsgId, originTopic, unitMode, maxReconsumeTimes (the
#        stock C++ client sends only group/offset/delayLevel).
#          1. the role gate (writes only on the writable leader);
#          2. the subscription group (auto-created when
#             autoCreateSubscriptionGroup, else SUBSCRIPTION_GROUP_NOT_EXIST);
#             retryQueueNums <= 0 means "drop it": SUCCESS, nothing stored;
#          3. %RETRY%<group> auto-created (retryQueueNums queues, perm RW);
#          4. the original record, committed data only (else SYSTEM_ERROR
#             "look message by offset failed");
#          5. reconsumeTimes >= maxReconsumeTimes (the header's, else the
#             group's retryMaxTimes) or delayLevel < 0 -> %DLQ%<group>
#             (1 queue, perm RW as RocketMQ 4.9+, no delay); otherwise
#             %RETRY%<group> with delay level `delayLevel`, or 3 +
#             reconsumeTimes when 0 -- which broker/store/schedule.py turns into a
#             SCHEDULE_TOPIC_XXXX record delivered when due;
#          6. the new record: body, flag, sysflag, born fields and properties
#             (tags, keys, UNIQ_KEY...) of the original, RETRY_TOPIC = the
#             original topic (kept when already set), ORIGIN_MESSAGE_ID = the
#             original's (or its offset message id), reconsumeTimes + 1;
#          7. SUCCESS only once committed; failures go through SendProcessor.refusal.
#
#   ensure_retry_topic()  what HEART_BEAT does for every consumer group on
#        the writable leader (ClientManageProcessor.heartBeat): the group
#        (auto-created) and its %RETRY% topic, so the topic is in the route
#        before a consumer subscribes to it.
import logging
import random

import attrs

from broker.common.msgid import offset_msg_id
from broker.common.permissions import PERM_READ, PERM_WRITE
from broker.common.values import InvalidMetadataError, TopicConfig
from broker.config import LiveConfig
from broker.metadata.service import MetadataService
from broker.metadata.tables import SubscriptionGroupConfig
from broker.processors.send import SendError, SendProcessor
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RequestError
from broker.remoting.header import HeaderReader
from broker.store.gate import RoleGate
from broker.store.schedule import to_schedule
from commitlog.errors import CommitLogError
from consumequeue import record as M
from consumequeue.errors import MessageNotFoundError
from consumequeue.reader import message_at
from consumequeue.service import ConsumeQueueService

log = logging.getLogger("ledgermq.retry")

RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
DLQ_NUMS_PER_GROUP = 1
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_WAIT_STORE_MSG_OK = "WAIT"
TOPIC_SYS_FLAG_UNIT_SUB = 0x2  # TopicSysFlag.buildSysFlag(false, true)
DEFAULT_RETRY_DELAY_BASE = 3  # delayLevel 0 -> 3 + reconsumeTimes


def retry_topic(group: str) -> str:
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_GROUP_TOPIC_PREFIX + group


@attrs.frozen
class SendBackHeader:
    offset: int
    group: str
    delay_level: int
    origin_msg_id: str | None = None
    origin_topic: str | None = None
    unit_mode: bool = False
    max_reconsume_times: int | None = None


def parse_send_back_header(request: RemotingCommand) -> SendBackHeader:
    h = HeaderReader(request.ext_fields)
    return SendBackHeader(offset=h.long("offset"), group=h.str("group"), delay_level=h.int("delayLevel"),
                          origin_msg_id=h.str("originMsgId", None), origin_topic=h.str("originTopic", None),
                          unit_mode=h.bool("unitMode", False),
                          max_reconsume_times=h.int("maxReconsumeTimes", None))


@attrs.frozen
class SendBack:
    """Where a failed message goes, and as what."""

    record: M.MessageRecord  # already rewritten for its delay level when it has one
    to_dlq: bool
    delay_level: int  # 0 for the DLQ


def plan_send_back(original: M.MessageRecord, original_phy: int, header: SendBackHeader, max_reconsume_times: int,
                   *, queue_id: int, store_host: M.HostAddr, now_ms: int, max_level: int) -> SendBack:
    """The pure core of consumerSendMsgBack: the record to store."""
    props = dict(original.properties)
    props.setdefault(PROPERTY_RETRY_TOPIC, original.topic)
    props[PROPERTY_WAIT_STORE_MSG_OK] = "false"
    props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, offset_msg_id(original.store_host, original_phy))
    props.pop(M.PROPERTY_DELAY, None)
    to_dlq = original.reconsume_times >= max_reconsume_times or header.delay_level < 0
    if to_dlq:
        topic, queue_id, level = dlq_topic(header.group), 0, 0
    else:
        topic = retry_topic(header.group)
        level = header.delay_level or DEFAULT_RETRY_DELAY_BASE + original.reconsume_times
        props[M.PROPERTY_DELAY] = str(level)
    rec = M.MessageRecord(topic=topic, body=original.body, properties=props, queue_id=queue_id, flag=original.flag,
                          sysflag=original.sysflag, born_timestamp=original.born_timestamp,
                          born_host=original.born_host, store_timestamp=now_ms, store_host=store_host,
                          reconsume_times=original.reconsume_times + 1)
    return SendBack(to_schedule(rec, max_level), to_dlq, level)


# --- metadata: groups and retry topics -----------------------------------------------


async def ensure_group(metadata, cfg, group: str) -> SubscriptionGroupConfig | None:
    """SubscriptionGroupManager.findSubscriptionGroupConfig: the group's
    config, auto-created (replicated) when autoCreateSubscriptionGroup."""
    found = metadata.group_config(group)
    if found is None and cfg.auto_create_subscription_group:
        log.info("auto-creating subscription group %s", group)
        await metadata.update_group(SubscriptionGroupConfig(group))
        found = metadata.group_config(group)
    return found


async def ensure_topic(metadata, topic: str, queue_nums: int, perm: int, sys_flag: int = 0) -> TopicConfig | None:
    """TopicConfigManager.createTopicInSendMessageBackMethod."""
    found = metadata.topic_config(topic)
    if found is None:
        log.info("auto-creating topic %s with %d queues", topic, queue_nums)
        await metadata.update_topic(TopicConfig(topic, queue_nums, queue_nums, perm, topic_sys_flag=sys_flag))
        found = metadata.topic_config(topic)
    return found


async def ensure_retry_topic(metadata, gate, cfg, group: str, *, unit_mode: bool = False) -> TopicConfig | None:
    """HEART_BEAT's part: the group and its %RETRY% topic, on the writable
    leader only (a follower answers the heartbeat without creating)."""
    if not gate.writable:
        return None
    if metadata.group_config(group) is not None and metadata.topic_config(retry_topic(group)) is not None:
        return metadata.topic_config(retry_topic(group))
    group_cfg = await ensure_group(metadata, cfg, group)
    if group_cfg is None:
        return None
    return await ensure_topic(metadata, retry_topic(group), group_cfg.retry_queue_nums, PERM_READ | PERM_WRITE,
                              TOPIC_SYS_FLAG_UNIT_SUB if unit_mode else 0)


# --- the processor ------------------------------------------------------------------


@attrs.define(eq=False)
class RetryTopics:
    """The client processor's consumer-group hook: on the writable leader,
    a heartbeat's group and its %RETRY% topic are created (failures are
    logged; the next heartbeat tries again)."""

    config: LiveConfig
    metadata: MetadataService
    gate: RoleGate

    async def on_consumer_group(self, group: str, unit_mode: bool) -> None:
        try:
            await ensure_retry_topic(self.metadata, self.gate, self.config.current, group, unit_mode=unit_mode)
        except (CommitLogError, InvalidMetadataError) as e:
            log.warning("heartbeat of group %s: %%RETRY%% topic / group not created: %s", group, e)


@attrs.define(eq=False)
class SendBackProcessor:
    send: SendProcessor  # cfg, replica, gate, metadata, store and the error translation
    cq: ConsumeQueueService  # the committed record at an offset
    rng: random.Random = attrs.Factory(random.Random)

    CODES = (RequestCode.CONSUMER_SEND_MSG_BACK,)

    def register(self, dispatcher) -> None:
        dispatcher.register(RequestCode.CONSUMER_SEND_MSG_BACK, self)

    async def __call__(self, conn, request: RemotingCommand) -> RemotingCommand:
        return await self.process(request)

    async def process(self, request: RemotingCommand) -> RemotingCommand:
        s = self.send
        records: list[bytes] = []
        try:
            h = parse_send_back_header(request)
            s.gate.check_writable()
            group_cfg = await ensure_group(s.metadata, s.cfg, h.group)
            if group_cfg is None:
                raise SendError(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group not exist, {h.group}")
            if not s.cfg.broker_permission & PERM_WRITE:
                raise SendError(ResponseCode.NO_PERMISSION,
                                f"the broker[{s.cfg.broker_ip1}] sending message is forbidden")
            if group_cfg.retry_queue_nums <= 0:
                return request.make_response(ResponseCode.SUCCESS)
            topic_cfg = await ensure_topic(s.metadata, retry_topic(h.group), group_cfg.retry_queue_nums,
                                           PERM_READ | PERM_WRITE, TOPIC_SYS_FLAG_UNIT_SUB if h.unit_mode else 0)
            self._check_writable_topic(topic_cfg, retry_topic(h.group))
            try:
                original = M.decode(message_at(self.cq, h.offset))
            except (MessageNotFoundError, M.MessageFormatError) as exc:
                raise SendError(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {h.offset}: {exc}") \
                    from None
            max_times = h.max_reconsume_times if h.max_reconsume_times is not None else group_cfg.retry_max_times
            plan = plan_send_back(original, h.offset, h, max_times,
                                  queue_id=self.rng.randrange(max(1, group_cfg.retry_queue_nums)),
                                  store_host=s.cfg.store_host, now_ms=s.clock_ms(),
                                  max_level=len(s.cfg.message_delay_levels_ms))
            if plan.to_dlq:
                dlq_cfg = await ensure_topic(s.metadata, dlq_topic(h.group), DLQ_NUMS_PER_GROUP, PERM_READ | PERM_WRITE)
                self._check_writable_topic(dlq_cfg, dlq_topic(h.group))
                log.info("message %s of group %s goes to %s after %d reconsumes", original.uniq_key, h.group,
                         dlq_topic(h.group), original.reconsume_times)
            s.gate.check_writable()
            records = [M.encode(plan.record)]
            await s.replica.append(records)
            return request.make_response(ResponseCode.SUCCESS)
        except (SendError, RequestError, CommitLogError, InvalidMetadataError, M.MessageFormatError) as exc:
            return s.refusal(request, exc, records)

    @staticmethod
    def _check_writable_topic(cfg: TopicConfig | None, topic: str) -> None:
        if cfg is None:
            raise SendError(ResponseCode.SYSTEM_ERROR, f"topic[{topic}] not exist")
        if not cfg.perm & PERM_WRITE:
            raise SendError(ResponseCode.NO_PERMISSION, f"the topic[{topic}] sending message is forbidden")
