# The RocketMQ remoting protocol (spec §8): RemotingCommand, its sans-IO
# codec, the trio server and its connections, and the anyio client, built on it.
from broker.remoting.client import RemotingClient, open_remoting_client, parse_addr
from broker.remoting.codec import DEFAULT_MAX_FRAME_SIZE, CommandDecoder, encode_command
from broker.remoting.codes import LanguageCode, RequestCode, ResponseCode, SerializeType
from broker.remoting.command import RemotingCommand
from broker.remoting.connection import Connection
from broker.remoting.errors import (
                                    LocalProtocolError,
                                    RemoteProtocolError,
                                    RemotingConnectError,
                                    RemotingConnectionLostError,
                                    RemotingError,
                                    RemotingTimeoutError,
                                    RequestError,
                                    ResponseError,
)
from broker.remoting.header import HeaderReader, decode_json, encode_json
from broker.remoting.server import RemotingServer, RequestDispatcher, serve_remoting

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE", "CommandDecoder", "Connection", "HeaderReader", "LanguageCode",
    "LocalProtocolError", "RemoteProtocolError", "RemotingClient", "RemotingCommand",
    "RemotingConnectError", "RemotingConnectionLostError", "RemotingError", "RemotingServer",
    "RemotingTimeoutError", "RequestCode", "RequestDispatcher", "RequestError", "ResponseCode",
    "ResponseError", "SerializeType", "decode_json", "encode_command", "encode_json",
    "open_remoting_client", "parse_addr", "serve_remoting",
]
