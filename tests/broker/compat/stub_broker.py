# A minimal stand-in broker for compat tests of the name server: a
# serve_remoting server that records every request a stock client sends and
# answers the producer's path the way a RocketMQ 4.x broker would
# (SEND_MESSAGE / SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE -> SUCCESS with
# msgId, queueId, queueOffset; HEART_BEAT and UNREGISTER_CLIENT -> SUCCESS).
# Everything else gets REQUEST_CODE_NOT_SUPPORTED.  Not a broker: nothing is
# stored; offsets count per queue from 0.
import ipaddress
import itertools

import trio

from broker.remoting.codes import RequestCode
from broker.remoting.command import RemotingCommand
from broker.remoting.header import HeaderReader
from broker.remoting.server import RequestDispatcher, serve_remoting

SEND_CODES = (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE)
# SendMessageRequestHeaderV2's one-letter keys (RocketMQ's createSendMessageRequestHeaderV1).
V2_NAMES = {"a": "producerGroup", "b": "topic", "c": "defaultTopic", "d": "defaultTopicQueueNums",
            "e": "queueId", "f": "sysFlag", "g": "bornTimestamp", "h": "flag", "i": "properties",
            "j": "reconsumeTimes", "k": "unitMode", "l": "maxReconsumeTimes", "m": "batch"}


def send_header_v1(cmd: RemotingCommand) -> dict[str, str]:
    """A send request's extFields under the full (V1) names."""
    if cmd.code == RequestCode.SEND_MESSAGE_V2 or (cmd.code == RequestCode.SEND_BATCH_MESSAGE and "b" in cmd.ext_fields):
        return {V2_NAMES.get(k, k): v for k, v in cmd.ext_fields.items()}
    return dict(cmd.ext_fields)


def parse_properties(text: str) -> dict[str, str]:
    """MessageDecoder.string2messageProperties: name\\x01value\\x02 ..."""
    out = {}
    for item in text.split("\x02"):
        if "\x01" in item:
            k, v = item.split("\x01", 1)
            out[k] = v
    return out


def offset_msg_id(host: str, port: int, commitlog_offset: int) -> str:
    """hex(storeHost IPv4 + port + commitlog offset), client-compat #10."""
    raw = ipaddress.IPv4Address(host).packed + port.to_bytes(4, "big") + commitlog_offset.to_bytes(8, "big")
    return raw.hex().upper()


class StubBroker:
    def __init__(self) -> None:
        self.requests: list[RemotingCommand] = []
        self.sends: list[RemotingCommand] = []
        self.send_seen = trio.Event()
        self.server = None
        self._queue_offsets: dict[tuple[str, int], int] = {}
        self._commitlog = itertools.count(0, 256)
        d = self.dispatcher = RequestDispatcher()
        for code in SEND_CODES:
            d.register(code, self._send)
        d.register(RequestCode.HEART_BEAT, self._ok)
        d.register(RequestCode.UNREGISTER_CLIENT, self._ok)

    @property
    def address(self) -> str:
        return self.server.address

    async def handle(self, conn, cmd: RemotingCommand):
        self.requests.append(cmd)
        return await self.dispatcher(conn, cmd)

    async def _ok(self, conn, cmd):
        return cmd.make_response()

    async def _send(self, conn, cmd):
        self.sends.append(cmd)
        self.send_seen.set()
        h = HeaderReader(send_header_v1(cmd))
        topic, queue_id = h.str("topic"), h.int("queueId")
        offset = self._queue_offsets.get((topic, queue_id), 0)
        self._queue_offsets[topic, queue_id] = offset + 1
        host, port = self.server.sockname
        resp = cmd.make_response(ext_fields={
            "msgId": offset_msg_id(host, port, next(self._commitlog)), "queueId": queue_id,
            "queueOffset": offset, "transactionId": None})
        return None if cmd.is_oneway else resp


async def serve_stub_broker(host: str = "127.0.0.1", port: int = 0, *,
                            task_status=trio.TASK_STATUS_IGNORED) -> None:
    stub = StubBroker()
    async with trio.open_nursery() as nursery:
        stub.server = await nursery.start(serve_remoting, stub.handle, host, port)
        task_status.started(stub)
