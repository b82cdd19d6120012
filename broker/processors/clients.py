# Owns the broker's client requests (RocketMQ's ClientManageProcessor):
#
#   HEART_BEAT 34                  producer/consumer registration into the
#                                  ClientManager; enums by name or ordinal
#                                  (client-compat #5); each consumer group is
#                                  then handed to the group hook (on the
#                                  writable leader it auto-creates the group
#                                  and its %RETRY%<group> topic through the
#                                  replicated metadata: processors.retry)
#   UNREGISTER_CLIENT 35
#   GET_CONSUMER_LIST_BY_GROUP 38  {"consumerIdList":[...]}
#   CHECK_CLIENT_CONFIG 46         a Java consumer's check of each SQL92
#                                  subscription at start (checkClientInBroker):
#                                  SYSTEM_ERROR without enablePropertyFilter,
#                                  SUBSCRIPTION_PARSE_FAILED if it does not parse
from collections.abc import Callable
from typing import Protocol

import attrs

from broker.common.subscription import SubscriptionError, parse_subscription
from broker.processors.base import RequestProcessor
from broker.processors.client_manager import ClientManager
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RequestError
from broker.remoting.header import HeaderReader, decode_json, encode_json


class ConsumerGroupHook(Protocol):
    """Told of every consumer group a heartbeat carries."""

    async def on_consumer_group(self, group: str, unit_mode: bool) -> None: ...


@attrs.define(eq=False)
class ClientProcessor(RequestProcessor):
    clients: ClientManager
    groups: ConsumerGroupHook | None = None  # None: a registry only (no metadata to create groups in)
    # enablePropertyFilter as it is now (the composition root reads LiveConfig)
    property_filter: Callable[[], bool] = lambda: False

    CODES = (RequestCode.HEART_BEAT, RequestCode.UNREGISTER_CLIENT, RequestCode.GET_CONSUMER_LIST_BY_GROUP,
             RequestCode.CHECK_CLIENT_CONFIG)

    def handlers(self) -> dict:
        return {
            RequestCode.HEART_BEAT: self.heart_beat,
            RequestCode.UNREGISTER_CLIENT: self.unregister_client,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: self.get_consumer_list_by_group,
            RequestCode.CHECK_CLIENT_CONFIG: self.check_client_config,
        }

    async def handle(self, conn, request: RemotingCommand) -> RemotingCommand:
        return await self.handlers()[request.code](conn, request)

    async def heart_beat(self, conn, request: RemotingCommand) -> RemotingCommand:
        data = decode_json(request.body, "HeartbeatData")
        if not isinstance(data, dict):
            raise RequestError(ResponseCode.SYSTEM_ERROR, "HeartbeatData must be a JSON object")
        self.clients.heartbeat(conn, request, data)
        if self.groups is not None:
            # Answered SUCCESS whatever happens there (Java does too); the
            # next heartbeat tries again.
            for cd in data.get("consumerDataSet") or []:
                await self.groups.on_consumer_group(cd["groupName"], bool(cd.get("unitMode")))
        return request.make_response(ResponseCode.SUCCESS)

    async def unregister_client(self, conn, request: RemotingCommand) -> RemotingCommand:
        h = HeaderReader(request.ext_fields)
        self.clients.unregister(conn, h.str("clientID"), producer_group=h.str("producerGroup", None),
                                consumer_group=h.str("consumerGroup", None))
        return request.make_response(ResponseCode.SUCCESS)

    async def get_consumer_list_by_group(self, conn, request: RemotingCommand) -> RemotingCommand:
        group = HeaderReader(request.ext_fields).str("consumerGroup")
        ids = self.clients.consumer_ids(group)
        if not ids:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return request.make_response(ResponseCode.SUCCESS, None, None, encode_json({"consumerIdList": ids}))

    async def check_client_config(self, conn, request: RemotingCommand) -> RemotingCommand:
        """CheckClientRequestBody {clientId, group, subscriptionData}: a Java
        push consumer refuses to start unless this answers SUCCESS, so a bad
        expression is reported at start, not at its first pull.  Checked in
        Java's order: tag subscriptions pass, then enablePropertyFilter, then
        the expression must compile (an unknown type does not either)."""
        body = decode_json(request.body, "CheckClientRequestBody") if request.body else None
        sub = body.get("subscriptionData") if isinstance(body, dict) else None
        if not isinstance(sub, dict):
            return request.make_response(ResponseCode.SUCCESS)
        etype = str(sub.get("expressionType") or "TAG").strip().upper() or "TAG"
        if etype == "TAG":
            return request.make_response(ResponseCode.SUCCESS)
        if not self.property_filter():
            return request.make_response(ResponseCode.SYSTEM_ERROR,
                                         f"The broker does not support consumer to filter message by {etype}")
        try:
            parse_subscription(sub.get("subString"), 0, etype)
        except SubscriptionError as e:
            return request.make_response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, e.remark)
        return request.make_response(ResponseCode.SUCCESS)
