# Owns the request side of transactional messages (RocketMQ's
# EndTransactionProcessor and Broker2Client.checkProducerTransactionState):
#
#   END_TRANSACTION 37   header producerGroup, tranStateTableOffset (the
#        half's queue offset), commitLogOffset (its commitlog offset),
#        commitOrRollback (8 commit, 12 rollback, 0 unknown: ignored),
#        fromTransactionCheck, msgId, transactionId.  Usually oneway.
#          1. the role gate (the master only);
#          2. the half at commitLogOffset, committed data only; it must be
#             on RMQ_SYS_TRANS_HALF_TOPIC at tranStateTableOffset and belong
#             to producerGroup (else SYSTEM_ERROR, Java's remarks);
#          3. the check service's claim (broker/store/transaction.py): a
#             half resolved already (or being resolved) is answered SUCCESS
#             and nothing is stored again;
#          4. commit: the real message (turned into its delay level when it
#             has one) and the op record in ONE append; rollback: the op
#             record alone.  Answered after the append committed.
#   TransactionCheckBack what the check service calls for a due half:
#        CHECK_TRANSACTION_STATE 39 (oneway) to one live connection of the
#        half's producer group, rotating among them -- with ACL on, only
#        among the connections the ACL lets see the half (may_check_back:
#        an account they authenticated as holds PUB on the half's real
#        topic), since any account can declare any producer group in a
#        heartbeat; the body is the half as
#        the producer's listener sees it (its real topic and queue), the
#        header names the re-put copy (tranStateTableOffset, commitLogOffset)
#        and its keys (msgId = transactionId = UNIQ_KEY, offsetMsgId).
import itertools
import logging
from collections.abc import Callable

import attrs

from broker.common.msgid import offset_msg_id
from broker.processors.client_manager import ClientManager
from broker.processors.send import SendError, SendProcessor
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RemotingError, RequestError
from broker.remoting.header import HeaderReader
from broker.store.schedule import to_schedule
from broker.store.timer import to_timer
from broker.store.transaction import (
    HALF_TOPIC,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_TOPIC,
    TransactionError,
    TransactionService,
    as_checked,
    from_half,
    op_record,
)
from commitlog.errors import CommitLogError
from consumequeue import record as M
from consumequeue.errors import MessageNotFoundError
from consumequeue.reader import message_at
from consumequeue.service import ConsumeQueueService

log = logging.getLogger("ledgermq.transaction")

CHECK_TIMEOUT_S = 3.0


@attrs.frozen
class EndTransactionHeader:
    producer_group: str
    tran_state_table_offset: int
    commit_log_offset: int
    commit_or_rollback: int
    from_check: bool = False
    msg_id: str | None = None
    transaction_id: str | None = None


def parse_end_transaction_header(request: RemotingCommand) -> EndTransactionHeader:
    h = HeaderReader(request.ext_fields)
    return EndTransactionHeader(
        producer_group=h.str("producerGroup"), tran_state_table_offset=h.long("tranStateTableOffset"),
        commit_log_offset=h.long("commitLogOffset"), commit_or_rollback=h.int("commitOrRollback"),
        from_check=h.bool("fromTransactionCheck", False), msg_id=h.str("msgId", None),
        transaction_id=h.str("transactionId", None))


@attrs.define(eq=False, kw_only=True)
class EndTransactionProcessor:
    send: SendProcessor  # config, replica, gate, store and the one error translation (refusal)
    service: TransactionService  # claims: which halves are resolved or being resolved
    cq: ConsumeQueueService  # where the half is read

    CODES = (RequestCode.END_TRANSACTION,)

    def register(self, dispatcher) -> None:
        dispatcher.register(RequestCode.END_TRANSACTION, self)

    async def __call__(self, conn, request: RemotingCommand) -> RemotingCommand | None:
        response = await self.process(request)
        return None if request.is_oneway else response

    async def process(self, request: RemotingCommand) -> RemotingCommand:
        s = self.send
        records: list[bytes] = []
        half = None
        try:
            h = parse_end_transaction_header(request)
            s.gate.check_writable()
            tran = h.commit_or_rollback
            if tran not in (M.TRANSACTION_COMMIT_TYPE, M.TRANSACTION_ROLLBACK_TYPE):
                log.info("END_TRANSACTION for %s of %s: state unknown (%d), checked back later", h.transaction_id,
                         h.producer_group, tran)
                return request.make_response(ResponseCode.SUCCESS)
            half = self._half(h)
            if not self.service.claim(half):
                log.debug("END_TRANSACTION for %s: already resolved", half.uniq_key)
                half = None
                return request.make_response(ResponseCode.SUCCESS)
            now = s.clock_ms()
            host = s.cfg.store_host
            if tran == M.TRANSACTION_COMMIT_TYPE:
                real = to_schedule(from_half(half, store_timestamp=now, store_host=host),
                                   len(s.cfg.message_delay_levels_ms))
                real = to_timer(real, now, s.cfg)  # a timer half waits for its time from the commit
                records.append(M.encode(real))
            records.append(M.encode(op_record(half, store_timestamp=now, store_host=host)))
            s.gate.check_writable()
            await s.replica.append(records)
            log.debug("transaction %s of %s %s", half.uniq_key, h.producer_group,
                      "committed" if tran == M.TRANSACTION_COMMIT_TYPE else "rolled back")
            half = None  # resolved: the op record keeps it so
            return request.make_response(ResponseCode.SUCCESS)
        except TransactionError as exc:
            return request.make_response(ResponseCode.SYSTEM_ERROR, str(exc))
        except (SendError, RequestError, CommitLogError, M.MessageFormatError) as exc:
            return s.refusal(request, exc, records)
        finally:
            if half is not None:
                self.service.release(half)

    def _half(self, h: EndTransactionHeader) -> M.MessageRecord:
        """checkPrepareMessage: the half the header names, or TransactionError."""
        try:
            half = M.decode(message_at(self.cq, h.commit_log_offset))
        except (MessageNotFoundError, M.MessageFormatError) as exc:
            raise TransactionError(f"Find prepared transaction message failed: {exc}") from None
        if half.topic != HALF_TOPIC:
            raise TransactionError(f"the message at {h.commit_log_offset} is not a half message")
        if half.properties.get(PROPERTY_PRODUCER_GROUP) != h.producer_group:
            raise TransactionError("The producer group wrong")
        if half.queue_offset != h.tran_state_table_offset:
            raise TransactionError("The transaction state table offset wrong")
        return half


@attrs.define(eq=False, kw_only=True)
class TransactionCheckBack:
    """The check service's check_back (transaction.CheckBack): built before
    the service and the processor, it needs neither."""

    clients: ClientManager  # the producer connections heartbeats registered
    # (connection, producer group, real topic) -> may that connection be
    # sent the half?  None (ACL off): every producer of the group.
    may_check_back: Callable[[object, str, str], bool] | None = None
    _turn: itertools.count = attrs.Factory(itertools.count)

    async def __call__(self, group: str, half: M.MessageRecord) -> bool:
        """CHECK_TRANSACTION_STATE to one producer of `group`; False when none
        is connected or the one chosen could not be told."""
        channels = self.clients.producer_channels(group)
        if self.may_check_back is not None:
            topic = half.properties.get(PROPERTY_REAL_TOPIC, "")
            channels = [ch for ch in channels if self.may_check_back(ch.conn, group, topic)]
        if not channels:
            return False
        checked = as_checked(half)
        uniq = half.uniq_key or ""
        fields = {"tranStateTableOffset": str(half.queue_offset), "commitLogOffset": str(half.physical_offset),
                  "msgId": uniq, "transactionId": uniq,
                  "offsetMsgId": offset_msg_id(half.store_host, half.physical_offset)}
        cmd = RemotingCommand.create_request(RequestCode.CHECK_TRANSACTION_STATE, fields, body=M.encode(checked))
        start = next(self._turn)
        for i in range(len(channels)):  # the next producer if one cannot be reached
            ch = channels[(start + i) % len(channels)]
            try:
                await ch.conn.send_request_oneway(cmd, timeout=CHECK_TIMEOUT_S)
                return True
            except (RemotingError, OSError) as exc:
                log.debug("CHECK_TRANSACTION_STATE to %s failed: %s", ch.client_id, exc)
        return False
