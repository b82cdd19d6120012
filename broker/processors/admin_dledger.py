# Owns the broker's replication admin requests, ledgermq's own codes (DLedger
# had no operator tooling), what mqadmin's dledgerStatus /
# leadershipTransfer / compareReplicas / member commands send:
#
#   LEDGERMQ_DLEDGER_STATUS 9100       JSON {selfId, group, brokerName, brokerAddr, brokerId, role, term, leader,
#                                      leaderBrokerAddr, ledgerBeginIndex, ledgerEndIndex, committedIndex,
#                                      peers: {id: {matchIndex, lag, lastAckMsAgo, ...}}, refusedLeader,
#                                      identity, links: {id: {connected, lastError}}, process: {pid,
#                                      startedAtMs}, voters, learners, configIndex} from ReplicaNode.status()
#                                      and the transport
#   LEDGERMQ_TRANSFER_LEADERSHIP 9101  header targetId; on the leader: hand over, answered once this node
#                                      stepped down; elsewhere SERVICE_NOT_AVAILABLE naming the leader
#   LEDGERMQ_CHAIN_CRC 9102            header index (<= committed); fields chainCrc, committedIndex,
#                                      ledgerBeginIndex
#   LEDGERMQ_CHANGE_MEMBERSHIP 9103    header change (addLearner | promote | remove), peerId, peerAddr
#                                      (addLearner only), timeoutMillis; on the leader one single-server
#                                      change, answered once committed (a promotion first waits for the
#                                      learner to catch up), fields configIndex, voters, learners; elsewhere
#                                      SERVICE_NOT_AVAILABLE naming the leader; refused: SYSTEM_ERROR with the
#                                      reason (commitlog/raft/membership.py)
#
# The chain CRC of entry i covers the whole history up to i (README, "Entry
# CRCs"), so two replicas agree up to i iff their chainCrc at i is equal:
# compareReplicas is a binary search over these answers.
import json
import logging
import os
import time

import attrs
import trio

from broker.config import LiveConfig
from broker.processors.base import RequestProcessor
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RequestError
from broker.remoting.header import HeaderReader
from broker.store.broker_store import BrokerStore
from commitlog.errors import IndexBelowBeginError, IndexBeyondEndError, LeadershipTransferError
from commitlog.raft.membership import ChangeKind, ConfChange, MembershipChangeError
from commitlog.replica import ReplicaNode

log = logging.getLogger("ledgermq.admin.dledger")

STARTED_AT_MS = int(time.time() * 1000)  # this process's start, as its status reports it

TRANSFER_TIMEOUT_S = 5.0
CHANGE_TIMEOUT_S = 30.0


@attrs.define(eq=False)
class DLedgerAdminProcessor(RequestProcessor):
    config: LiveConfig
    store: BrokerStore

    CODES = (RequestCode.LEDGERMQ_DLEDGER_STATUS, RequestCode.LEDGERMQ_TRANSFER_LEADERSHIP,
             RequestCode.LEDGERMQ_CHAIN_CRC, RequestCode.LEDGERMQ_CHANGE_MEMBERSHIP)
    commitlog_error_code = ResponseCode.SYSTEM_ERROR  # e.g. an index this node does not hold

    @property
    def replica(self) -> ReplicaNode:
        return self.store.replica

    def handlers(self) -> dict:
        return {
            RequestCode.LEDGERMQ_DLEDGER_STATUS: self.status,
            RequestCode.LEDGERMQ_TRANSFER_LEADERSHIP: self.transfer,
            RequestCode.LEDGERMQ_CHAIN_CRC: self.chain_crc,
            RequestCode.LEDGERMQ_CHANGE_MEMBERSHIP: self.change_membership,
        }

    def status_dict(self) -> dict:
        cfg = self.config.current
        st = self.replica.status()
        st.pop("stats", None)
        transport = self.store.transport
        # Why a peer is not connected (e.g. its log identity differs).
        links = {p.peer_id: {"connected": p.connected, "lastError": p.last_error}
                 for p in transport.stats().peers.values()}
        # The peer map knows DLedger peer addresses; operators know broker addresses.
        out = {"selfId": st.pop("node"), "group": cfg.replication.group, "brokerName": cfg.broker_name,
               "clusterName": cfg.broker_cluster_name, "brokerAddr": cfg.broker_addr,
               "brokerId": self.store.gate.broker_id,
               "writable": bool(self.store.gate.writable), "identity": dict(transport.identity),
               "links": links, "process": {"pid": os.getpid(), "startedAtMs": STARTED_AT_MS}, **st}
        return out

    async def status(self, request: RemotingCommand) -> RemotingCommand:
        body = json.dumps(self.status_dict(), sort_keys=True).encode()
        return request.make_response(ResponseCode.SUCCESS, None, None, body)

    async def transfer(self, request: RemotingCommand) -> RemotingCommand:
        target = HeaderReader(request.ext_fields).str("targetId").strip()
        replica = self.replica
        if target == replica.node_id:
            if replica.is_leader:
                return request.make_response(ResponseCode.SUCCESS, f"{target} is already the leader")
            raise replica.leader_error()
        voters = replica.core.voters
        if target not in voters:
            raise RequestError(ResponseCode.INVALID_PARAMETER,
                               f"{target!r} is not a voter of group {self.config.current.replication.group} "
                               f"(voters: {', '.join(voters)})")
        try:
            await replica.transfer_leadership(target, timeout=TRANSFER_TIMEOUT_S)
        except LeadershipTransferError as e:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"leadership transfer to {target} refused: {e}") from None
        except trio.TooSlowError:
            raise RequestError(ResponseCode.SYSTEM_ERROR,
                               f"leadership transfer to {target} did not finish within {TRANSFER_TIMEOUT_S:g} s "
                               f"(is it caught up and reachable?)") from None
        st = replica.status()
        log.info("leadership transferred from %s to %s (term %d)", replica.node_id, target, st["term"])
        return request.make_response(ResponseCode.SUCCESS, None, {"term": st["term"], "leader": st["leader"] or ""})

    async def change_membership(self, request: RemotingCommand) -> RemotingCommand:
        h = HeaderReader(request.ext_fields)
        kind_text = h.str("change").strip()
        try:
            kind = ChangeKind(kind_text)
        except ValueError:
            raise RequestError(ResponseCode.INVALID_PARAMETER,
                               f"change={kind_text!r}: one of {', '.join(k.value for k in ChangeKind)}") from None
        change = ConfChange(kind, h.str("peerId").strip(), (h.str("peerAddr", "") or "").strip() or None)
        timeout = (h.long("timeoutMillis", 0) or 0) / 1000 or CHANGE_TIMEOUT_S
        if self.replica.is_leader:
            # A new leader opens writes only after announcing its broker
            # address through the log; a change proposed before that (a
            # removal right after removeDLedgerPeer's hand-over) could
            # commit first, and the removed node would never learn where
            # the master is (it hands the sends it still gets on to it).
            try:
                await self.store.gate.wait_writable(timeout)
            except trio.TooSlowError:
                raise RequestError(ResponseCode.SYSTEM_BUSY, f"{self.replica.node_id} leads but has not caught up "
                                   f"within {timeout:g} s; try again") from None
        try:
            entry = await self.replica.change_membership(change, timeout=timeout)
        except MembershipChangeError as e:
            raise RequestError(ResponseCode.SYSTEM_ERROR, str(e)) from None
        m = entry.membership
        log.info("%s of group %s: %s committed at %d (%s)", self.replica.node_id, self.config.current.replication.group,
                 change.describe(), entry.index, m.describe())
        return request.make_response(ResponseCode.SUCCESS, None, {
            "configIndex": entry.index, "voters": ",".join(m.voters), "learners": ",".join(m.learners)})

    async def chain_crc(self, request: RemotingCommand) -> RemotingCommand:
        index = HeaderReader(request.ext_fields).long("index")
        replica = self.replica
        st = replica.status()
        fields = {"committedIndex": st["committedIndex"], "ledgerBeginIndex": st["ledgerBeginIndex"]}
        try:
            crc = replica.chain_crc_at(index)
        except (IndexBeyondEndError, IndexBelowBeginError) as e:
            return request.make_response(ResponseCode.INVALID_PARAMETER, str(e), fields)
        return request.make_response(ResponseCode.SUCCESS, None, {**fields, "chainCrc": crc, "index": index})
