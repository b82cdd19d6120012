# Owns the transactional producer (Java's TransactionMQProducer): a half
# message first, the application's local transaction, then END_TRANSACTION
# with its outcome; and the answers to the broker's check-backs.
#
#   async def execute(msg, arg) -> LocalTransactionState: ...   # the local transaction
#   async def check(msg: MessageExt) -> LocalTransactionState: ...  # "what became of it?"
#   async with open_transactional_producer("txg", namesrv_addr=ns, execute=execute, check=check) as p:
#       r = await p.send_in_transaction(Message("Orders", b"..."), arg)
#
# send_in_transaction: the message goes with TRAN_MSG=true, PGROUP=<group>
# and the PREPARED sysflag (the broker stores it where no consumer sees it);
# once it is stored, execute(msg, arg) runs; its state (an exception or
# anything that is not a LocalTransactionState counts as UNKNOW) goes to
# the broker that stored the half as END_TRANSACTION (oneway): COMMIT_MESSAGE
# delivers the message, ROLLBACK_MESSAGE drops it, UNKNOW leaves it to the
# check-back.  A half that could not be stored is rolled back at once.
#
# Check-backs: the broker pushes CHECK_TRANSACTION_STATE to any connected
# producer of the group (not only the one that sent the half: the sender may
# have died).  check(msg) runs in the producer's task group and its answer
# goes back as END_TRANSACTION with fromTransactionCheck, naming the half the
# broker named.  execute and check may be coroutine functions or plain ones
# (plain ones run in a worker thread, so they may block).
import enum
import inspect
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import attrs

from broker.client.errors import ClientError, InvalidArgumentError
from broker.client.instance import open_client_instance
from broker.client.model import Message, MessageExt, MessageQueue, SendResult, SendStatus
from broker.client.producer import Producer, SendFailedError
from broker.common.msgid import parse_offset_msg_id
from broker.remoting.codes import LanguageCode, RequestCode
from broker.remoting.command import RemotingCommand
from consumequeue import record as M

log = logging.getLogger("ledgermq.client.transaction")

PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"


class LocalTransactionState(enum.Enum):
    COMMIT_MESSAGE = M.TRANSACTION_COMMIT_TYPE
    ROLLBACK_MESSAGE = M.TRANSACTION_ROLLBACK_TYPE
    UNKNOW = M.TRANSACTION_NOT_TYPE  # (RocketMQ's spelling)


@attrs.frozen
class TransactionSendResult:
    send_result: SendResult
    local_state: LocalTransactionState

    @property
    def msg_id(self) -> str:
        return self.send_result.msg_id

    @property
    def transaction_id(self) -> str:
        return self.send_result.msg_id


Execute = Callable[[Message, object], object]
Check = Callable[[MessageExt], object]


async def _call(fn, *args) -> LocalTransactionState:
    """fn's state: awaited if it is a coroutine function, in a worker thread
    if it is a plain one; UNKNOW when it raises or answers something else."""
    try:
        if inspect.iscoroutinefunction(fn):
            state = await fn(*args)
        else:
            state = await anyio.to_thread.run_sync(fn, *args)
    except Exception:
        log.exception("the transaction listener raised; state unknown (the broker checks back)")
        return LocalTransactionState.UNKNOW
    if not isinstance(state, LocalTransactionState):
        log.error("the transaction listener returned %r, not a LocalTransactionState; state unknown", state)
        return LocalTransactionState.UNKNOW
    return state


class TransactionalProducer:
    """Use open_transactional_producer(); `producer` is the plain producer
    underneath (its send methods work as usual)."""

    def __init__(self, producer: Producer, execute: Execute, check: Check) -> None:
        self.producer = producer
        self.group = producer.group
        self.execute = execute
        self.check = check
        self.checks_answered = 0

    async def send_in_transaction(self, msg: Message, arg=None, *, timeout: float | None = None) -> \
            TransactionSendResult:
        if msg.delay_level:
            raise InvalidArgumentError("a transactional message cannot be delayed")
        p = self.producer
        uniq, req = p._request(msg, {PROPERTY_TRANSACTION_PREPARED: "true", PROPERTY_PRODUCER_GROUP: self.group},
                               sysflag=M.TRANSACTION_PREPARED_TYPE)
        result = await p._send(msg.topic, msg, lambda mq: p._for_queue(req, mq, RequestCode.SEND_MESSAGE_V2),
                               lambda resp, mq: p._result(resp, mq, uniq)[0], None, timeout)
        if result.status is SendStatus.SEND_OK:
            state = await _call(self.execute, msg, arg)
        else:  # not stored on a quorum for sure: do not run the local transaction
            state = LocalTransactionState.ROLLBACK_MESSAGE
        try:
            await self._end(result.queue, result.queue_offset, result.offset_msg_id, uniq, state, from_check=False)
        except ClientError as e:  # the check-back resolves it
            log.warning("END_TRANSACTION for %s failed (the broker will check back): %s", uniq, e)
        return TransactionSendResult(result, state)

    async def _end(self, mq: MessageQueue | None, queue_offset: int, offset_msg_id: str, uniq: str,
                   state: LocalTransactionState, *, from_check: bool, addr: str | None = None) -> None:
        """END_TRANSACTION (oneway) to `addr`, or to the master of mq's broker."""
        _host, phy = parse_offset_msg_id(offset_msg_id)
        req = RemotingCommand.create_request(RequestCode.END_TRANSACTION, {
            "producerGroup": self.group, "tranStateTableOffset": str(queue_offset), "commitLogOffset": str(phy),
            "commitOrRollback": str(state.value), "fromTransactionCheck": "true" if from_check else "false",
            "msgId": uniq, "transactionId": uniq}, language=LanguageCode.PYTHON)
        inst = self.producer.instance
        if addr is None:
            route = await inst.route(mq.topic)
            addr = route.master(mq.broker_name) if route is not None else None
            if addr is None:
                log.warning("END_TRANSACTION for %s: no master of %s in the route", uniq, mq.broker_name)
                return
        await inst.invoke_oneway(addr, req)

    # --- check-backs (CHECK_TRANSACTION_STATE) -------------------------------------

    def on_check(self, conn, cmd: RemotingCommand) -> None:
        """ClientInstance's callback: answer in the producer's task group."""
        self.producer._nursery.start_soon(self._answer, conn.remote_address, cmd)

    async def _answer(self, addr: str, cmd: RemotingCommand) -> None:
        f = cmd.ext_fields
        try:
            record = M.decode(cmd.body)
        except M.MessageFormatError as e:
            log.warning("undecodable check-back from %s: %s", addr, e)
            return
        msg = MessageExt.from_record(record, MessageQueue(record.topic, "", record.queue_id))
        state = await _call(self.check, msg)
        uniq = f.get("transactionId") or f.get("msgId") or record.uniq_key or ""
        try:
            await self._end(None, int(f.get("tranStateTableOffset", record.queue_offset)),
                            f.get("offsetMsgId") or msg.offset_msg_id, uniq, state, from_check=True, addr=addr)
            self.checks_answered += 1
        except (ClientError, ValueError) as e:
            log.warning("answer to the check of %s failed: %s", uniq, e)


@asynccontextmanager
async def open_transactional_producer(group: str, *, namesrv_addr, execute: Execute, check: Check,
                                      topics=(), timeout: float = 3.0, heartbeat_interval: float = 30.0,
                                      credentials=None, tls=None, **options) -> AsyncIterator[TransactionalProducer]:
    """A started transactional producer; `options` are Producer's keywords.
    `topics`: routes to fetch at once, so the brokers of those topics know
    this producer (and can check back with it) before it sends anything."""
    for name, fn in (("execute", execute), ("check", check)):
        if not callable(fn):
            raise InvalidArgumentError(f"{name} must be a function, not {fn!r}")
    async with open_client_instance(namesrv_addr, timeout=timeout, heartbeat_interval=heartbeat_interval,
                                    credentials=credentials, tls=tls) as (instance, tasks):
        producer = Producer(instance, tasks, group, **options)
        tx = TransactionalProducer(producer, execute, check)
        instance.producer_groups.add(group)
        instance.default_topic_queue_nums = producer.default_topic_queue_nums
        instance.transaction_checks[group] = tx.on_check
        for topic in topics:
            instance.auto_create_topics.add(topic)
            await instance.route(topic)
        if topics:
            await instance.heartbeat_all()
        try:
            yield tx
            await producer.drain()
        finally:
            producer.closed = True


__all__ = ["LocalTransactionState", "SendFailedError", "TransactionSendResult", "TransactionalProducer",
           "open_transactional_producer"]
