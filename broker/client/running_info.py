# Owns two small answers of the client instance that tools read: the
# ConsumerRunningInfo a client returns when a broker forwards
# GET_CONSUMER_RUNNING_INFO (307) from mqadmin or the dashboard, and the
# wording of a NoRouteError that says why the name servers gave no route
# (connection refused, timeout: the last remoting error), not only that
# they gave none.
#
# ConsumerRunningInfo (RocketMQ's JSON): properties (PROP_* strings),
# subscriptionSet (the heartbeat's SubscriptionData), mqTable and
# statusTable (per-queue process state; empty here: the Python client keeps
# no Java-style ProcessQueueInfo), jstack ("").
import os
import time

from broker.remoting.codes import ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.header import encode_json

_STARTED_MS = int(time.time() * 1000)


def running_info(client_id: str, consumer_data: dict) -> dict:
    return {
        "properties": {
            "PROP_CLIENT_ID": client_id,
            "PROP_CONSUME_TYPE": str(consumer_data.get("consumeType", "CONSUME_PASSIVELY")),
            "PROP_CONSUMEORDERLY": "false",
            "PROP_THREADPOOL_CORE_SIZE": "1",
            "PROP_CONSUMER_START_TIMESTAMP": str(_STARTED_MS),
            "PROP_CLIENT_VERSION": "ledgermq-python",
            "PROP_PID": str(os.getpid()),
            "messageModel": str(consumer_data.get("messageModel", "CLUSTERING")),
            "consumeFromWhere": str(consumer_data.get("consumeFromWhere", "")),
        },
        "subscriptionSet": list(consumer_data.get("subscriptionDataSet") or []),
        "mqTable": {},
        "statusTable": {},
        "jstack": "",
    }


def running_info_response(cmd: RemotingCommand, client_id: str, consumers: dict) -> RemotingCommand:
    """The answer to a forwarded GET_CONSUMER_RUNNING_INFO; `consumers` maps
    group -> the heartbeat consumerData builder."""
    group = cmd.ext_fields.get("consumerGroup", "")
    build = consumers.get(group)
    if build is None:
        return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"The Consumer Group <{group}> not exist in this consumer")
    return cmd.make_response(ResponseCode.SUCCESS, None, None, encode_json(running_info(client_id, build())))


def no_route_reason(reason: str, error: BaseException | None) -> str:
    return reason if error is None else f"{reason}; the name servers could not be asked: {error}"
