# Owns the calling side of the name server protocol: NamesrvClient (typed
# calls over a RemotingClient to one or more name servers) and
# run_broker_registration, the broker's periodic re-registration with every
# name server (RocketMQ's registerBrokerAll every registerNameServerPeriod,
# 30 s).
#
# Writes (register, unregister, delete topic) go to every name server in
# parallel and report per address, because name servers share nothing and a
# broker must be known to all of them.  Reads (route, cluster info, topic
# list) ask the name servers in order and return the first answer.
import logging
from collections.abc import Callable, Sequence

import anyio
import attrs
import trio

from broker.namesrv import protocol
from broker.namesrv.routes import BrokerData, BrokerRegistration, RegisterResult, RouteDataError, TopicRouteData
from broker.remoting.client import RemotingClient
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RemotingError, RequestError, ResponseError
from broker.remoting.header import decode_json

log = logging.getLogger(__name__)

DEFAULT_REGISTER_PERIOD = 30.0


def parse_namesrv_addrs(text: str | Sequence[str]) -> list[str]:
    """namesrvAddr ("a:9876;b:9876") or a list to a list of addresses."""
    items = text.split(";") if isinstance(text, str) else list(text)
    addrs = [a.strip() for a in items if a.strip()]
    if not addrs:
        raise ValueError(f"no name server address in {text!r}")
    return addrs


class NamesrvClient:
    def __init__(self, remoting: RemotingClient, addrs: str | Sequence[str], timeout: float = 3.0) -> None:
        self.remoting = remoting
        self.addrs = parse_namesrv_addrs(addrs)
        self.timeout = timeout

    async def _all(self, request: RemotingCommand) -> dict[str, RemotingCommand | RemotingError]:
        results: dict[str, RemotingCommand | RemotingError] = {}

        async def one(addr: str) -> None:
            try:
                resp = await self.remoting.invoke(addr, request, self.timeout)
            except RemotingError as e:
                results[addr] = e
                return
            results[addr] = resp if resp.code == ResponseCode.SUCCESS else ResponseError(addr, resp.code, resp.remark)

        async with anyio.create_task_group() as tasks:  # anyio: the client library calls it under asyncio too
            for addr in self.addrs:
                tasks.start_soon(one, addr)
        return {addr: results[addr] for addr in self.addrs}

    async def _first(self, request: RemotingCommand, accept=(ResponseCode.SUCCESS,)) -> tuple[str, RemotingCommand]:
        errors: list[RemotingError] = []
        for addr in self.addrs:
            try:
                resp = await self.remoting.invoke(addr, request, self.timeout)
            except RemotingError as e:
                errors.append(e)
                continue
            if resp.code in accept:
                return addr, resp
            errors.append(ResponseError(addr, resp.code, resp.remark))
        if len(errors) == 1:
            raise errors[0]
        raise RemotingError("no name server answered: " + "; ".join(str(e) for e in errors))

    # --- writes (every name server) ----------------------------------------------

    async def register_broker(self, reg: BrokerRegistration) -> dict[str, RegisterResult | RemotingError]:
        """Register with every name server.  A SUCCESS with a remark means the
        name server ignored the registration (a newer holder of the id)."""
        out: dict[str, RegisterResult | RemotingError] = {}
        for addr, resp in (await self._all(protocol.registration_request(reg))).items():
            if isinstance(resp, RemotingError):
                out[addr] = resp
            else:
                out[addr] = RegisterResult(accepted=not resp.remark, master_addr=resp.ext_fields.get("masterAddr"),
                                           ha_server_addr=resp.ext_fields.get("haServerAddr"), reason=resp.remark)
        return out

    async def unregister_broker(self, cluster_name: str, broker_addr: str, broker_name: str,
                                broker_id: int) -> dict[str, RemotingCommand | RemotingError]:
        return await self._all(protocol.unregister_request(cluster_name, broker_addr, broker_name, broker_id))

    async def delete_topic(self, topic: str,
                           cluster_name: str | None = None) -> dict[str, RemotingCommand | RemotingError]:
        return await self._all(protocol.delete_topic_request(topic, cluster_name))

    # --- reads (first name server that answers) -------------------------------------

    async def get_route(self, topic: str) -> TopicRouteData | None:
        """The topic's route, or None if the name server has none (17)."""
        addr, resp = await self._first(protocol.route_request(topic),
                                       accept=(ResponseCode.SUCCESS, ResponseCode.TOPIC_NOT_EXIST))
        if resp.code == ResponseCode.TOPIC_NOT_EXIST:
            return None
        return _parsed(addr, lambda: TopicRouteData.from_json(decode_json(resp.body, "TopicRouteData")))

    async def get_cluster_info(self) -> tuple[dict[str, BrokerData], dict[str, list[str]]]:
        """(brokerAddrTable, clusterAddrTable)."""
        addr, resp = await self._first(RemotingCommand.create_request(RequestCode.GET_BROKER_CLUSTER_INFO))

        def parse():
            obj = decode_json(resp.body, "ClusterInfo")
            brokers = {n: BrokerData.from_json(b) for n, b in (obj.get("brokerAddrTable") or {}).items()}
            return brokers, {c: list(names) for c, names in (obj.get("clusterAddrTable") or {}).items()}
        return _parsed(addr, parse)

    async def get_topic_list(self) -> list[str]:
        addr, resp = await self._first(RemotingCommand.create_request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER))
        return _parsed(addr, lambda: list(decode_json(resp.body, "TopicList").get("topicList") or []))


def _parsed(addr: str, parse):
    try:
        return parse()
    except (RequestError, RouteDataError, AttributeError, TypeError) as e:
        raise ResponseError(addr, ResponseCode.SUCCESS, f"unreadable response body: {e}") from None


@attrs.define
class Registrar:
    """What run_broker_registration() hands to task_status.started()."""

    rounds: int = 0
    last_results: dict[str, RegisterResult | RemotingError] = attrs.field(factory=dict)


async def run_broker_registration(namesrv: NamesrvClient, registration: Callable[[], BrokerRegistration],
                                  period: float = DEFAULT_REGISTER_PERIOD, *,
                                  task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Register with every name server now and then every `period` seconds
    until cancelled.  `registration` is called each round, so the current
    role (broker id), term (stateVersion) and topics are sent.  Failures are
    logged and retried next round; started() comes after the first round."""
    registrar = Registrar()
    while True:
        reg = registration()
        registrar.last_results = await namesrv.register_broker(reg)
        registrar.rounds += 1
        for addr, result in registrar.last_results.items():
            if isinstance(result, RemotingError):
                log.warning("register %s with %s failed: %s", reg.broker_addr, addr, result)
            elif not result.accepted:
                log.warning("name server %s ignored %s: %s", addr, reg.broker_addr, result.reason)
        if registrar.rounds == 1:
            task_status.started(registrar)
        await trio.sleep(period)
