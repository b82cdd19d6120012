# Owns the wire form of the name server's requests (spec §8.5): the
# REGISTER_BROKER header and RegisterBrokerBody JSON in both directions (the
# name server decodes them, brokers build them), and the small headers of
# UNREGISTER_BROKER, GET_ROUTEINFO_BY_TOPIC and DELETE_TOPIC_IN_NAMESRV.
#
# Compressed registration bodies (compressedRegister=true) use a custom
# deflated format that the spec does not document; they are refused with a
# clear error instead of being guessed at.
from broker.common.values import DataVersion, InvalidMetadataError, TopicConfig
from broker.namesrv.routes import BrokerRegistration, RouteDataError
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RequestError
from broker.remoting.header import HeaderReader, decode_json, encode_json
from native.hashing import masked_crc32

COMPRESSED_UNSUPPORTED = ("compressed RegisterBrokerBody (compressedRegister=true) is not supported by "
                          "the ledgermq name server; set compressedRegister=false on the broker")


def encode_register_body(reg: BrokerRegistration) -> bytes:
    return encode_json({
        "filterServerList": list(reg.filter_server_list),
        "topicConfigSerializeWrapper": {
            "dataVersion": reg.data_version.to_json(),
            "topicConfigTable": {name: tc.to_json() for name, tc in reg.topic_configs.items()},
        },
    })


def parse_register_body(body: bytes) -> tuple[dict[str, TopicConfig], DataVersion, tuple[str, ...]]:
    """(topic configs, dataVersion, filter servers); an empty body (old
    brokers) registers no topics."""
    if not body:
        return {}, DataVersion(), ()
    obj = decode_json(body, "RegisterBrokerBody")
    try:
        if not isinstance(obj, dict):
            raise RouteDataError("RegisterBrokerBody is not a JSON object")
        wrapper = obj.get("topicConfigSerializeWrapper") or {}
        if not isinstance(wrapper, dict):
            raise RouteDataError("topicConfigSerializeWrapper is not a JSON object")
        table = wrapper.get("topicConfigTable") or {}
        if not isinstance(table, dict):
            raise RouteDataError("topicConfigTable is not a JSON object")
        try:
            configs = {name: TopicConfig.from_json(tc, name) for name, tc in table.items()}
        except InvalidMetadataError as e:
            raise RouteDataError(f"topicConfigTable: {e}") from None
        version = DataVersion.from_json(wrapper.get("dataVersion") or {})
        servers = obj.get("filterServerList") or []
        if not isinstance(servers, list):
            raise RouteDataError("filterServerList is not a JSON array")
    except RouteDataError as e:
        raise RequestError(ResponseCode.SYSTEM_ERROR, f"bad RegisterBrokerBody: {e}") from None
    return configs, version, tuple(str(s) for s in servers)


def registration_request(reg: BrokerRegistration) -> RemotingCommand:
    body = encode_register_body(reg)
    fields = {"brokerName": reg.broker_name, "brokerAddr": reg.broker_addr, "clusterName": reg.cluster_name,
              "haServerAddr": reg.ha_server_addr, "brokerId": reg.broker_id, "compressed": False,
              "enableActingMaster": reg.enable_acting_master, "bodyCrc32": masked_crc32(body)}
    if reg.heartbeat_timeout is not None:
        fields["heartbeatTimeoutMillis"] = round(reg.heartbeat_timeout * 1000)
    return RemotingCommand.create_request(RequestCode.REGISTER_BROKER, fields, body)


def parse_registration(cmd: RemotingCommand) -> BrokerRegistration:
    h = HeaderReader(cmd.ext_fields)
    if h.bool("compressed", False):
        raise RequestError(ResponseCode.SYSTEM_ERROR, COMPRESSED_UNSUPPORTED)
    crc = h.int("bodyCrc32", 0)
    if crc != 0 and crc != masked_crc32(cmd.body):
        raise RequestError(ResponseCode.SYSTEM_ERROR, "crc32 not match")
    configs, version, servers = parse_register_body(cmd.body)
    timeout_ms = h.long("heartbeatTimeoutMillis", None)
    return BrokerRegistration(
        cluster_name=h.str("clusterName"), broker_name=h.str("brokerName"), broker_addr=h.str("brokerAddr"),
        broker_id=h.long("brokerId"), ha_server_addr=h.str("haServerAddr", ""), topic_configs=configs,
        data_version=version, filter_server_list=servers,
        heartbeat_timeout=timeout_ms / 1000 if timeout_ms and timeout_ms > 0 else None,
        enable_acting_master=h.bool("enableActingMaster", False))


def unregister_request(cluster_name: str, broker_addr: str, broker_name: str, broker_id: int) -> RemotingCommand:
    return RemotingCommand.create_request(RequestCode.UNREGISTER_BROKER, {
        "brokerName": broker_name, "brokerAddr": broker_addr, "clusterName": cluster_name,
        "brokerId": broker_id})


def route_request(topic: str) -> RemotingCommand:
    return RemotingCommand.create_request(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                          {"topic": topic, "acceptStandardJsonOnly": True})


def delete_topic_request(topic: str, cluster_name: str | None = None) -> RemotingCommand:
    return RemotingCommand.create_request(RequestCode.DELETE_TOPIC_IN_NAMESRV,
                                          {"topic": topic, "clusterName": cluster_name})
