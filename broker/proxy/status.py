# Owns the gRPC Status values the proxy answers, and the one translation of
# the client library's typed errors (a remoting answer or failure behind a
# relayed request) into them, as RocketMQ's proxy maps remoting response
# codes (ProxyException / GrpcConverter):
#   TOPIC_NOT_EXIST 17, no route       -> TOPIC_NOT_FOUND 40402
#   NO_PERMISSION 16, ACL refusal      -> FORBIDDEN 40300
#   MESSAGE_ILLEGAL 13                 -> BAD_REQUEST 40000
#   SYSTEM_BUSY 2                      -> TOO_MANY_REQUESTS 42900
#   FLUSH_DISK_TIMEOUT 10              -> MASTER_PERSISTENCE_TIMEOUT 50401
#   FLUSH_SLAVE_TIMEOUT 12             -> SLAVE_PERSISTENCE_TIMEOUT 50402
#   SLAVE_NOT_AVAILABLE 11             -> HA_NOT_AVAILABLE 50002
#   a timeout                          -> PROXY_TIMEOUT 50400
#   REQUEST_CODE_NOT_SUPPORTED 3       -> NOT_IMPLEMENTED 50100
#   NO_MESSAGE 208 (ack, change)       -> INVALID_RECEIPT_HANDLE 40013
#   SUBSCRIPTION_* 23..26              -> CONSUMER_GROUP_NOT_FOUND 40403 / ILLEGAL_FILTER_EXPRESSION 40010
#   anything else                      -> INTERNAL_SERVER_ERROR 50001
# A send that failed every attempt is judged by its last attempt's error.
from broker.client.errors import (
    AccessDeniedError,
    BrokerBusyError,
    BrokerError,
    ClientError,
    InvalidMessageError,
    MessageIllegalError,
    NoPermissionError,
    NoRouteError,
    NotSupportedError,
    RequestTimeoutError,
    SendFailedError,
    TopicNotExistError,
)
from broker.proxy import pb
from broker.remoting.codes import ResponseCode

_BY_RESPONSE = {
    ResponseCode.FLUSH_DISK_TIMEOUT: pb.Code.MASTER_PERSISTENCE_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: pb.Code.SLAVE_PERSISTENCE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: pb.Code.HA_NOT_AVAILABLE,
    ResponseCode.SUBSCRIPTION_PARSE_FAILED: pb.Code.ILLEGAL_FILTER_EXPRESSION,
    ResponseCode.SUBSCRIPTION_NOT_EXIST: pb.Code.CONSUMER_GROUP_NOT_FOUND,
    ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST: pb.Code.CONSUMER_GROUP_NOT_FOUND,
    ResponseCode.INVALID_PARAMETER: pb.Code.BAD_REQUEST,
    ResponseCode.NO_MESSAGE: pb.Code.INVALID_RECEIPT_HANDLE,  # an ack or change of what was acked or revived
}


def status(code: int, message: str = ""):
    return pb.Status(code=code, message=message[:1024])


def ok():
    return pb.Status(code=pb.Code.OK, message="OK")


def from_client_error(e: ClientError):
    """The Status of a relayed request that failed with `e`."""
    if isinstance(e, SendFailedError) and e.last is not None:
        inner = from_client_error(e.last)
        return status(inner.code, str(e))
    text = str(e)
    if isinstance(e, (TopicNotExistError, NoRouteError)):
        return status(pb.Code.TOPIC_NOT_FOUND, text)
    if isinstance(e, (NoPermissionError, AccessDeniedError)):
        return status(pb.Code.FORBIDDEN, text)
    if isinstance(e, (MessageIllegalError, InvalidMessageError)):
        return status(pb.Code.BAD_REQUEST, text)
    if isinstance(e, BrokerBusyError):
        return status(pb.Code.TOO_MANY_REQUESTS, text)
    if isinstance(e, NotSupportedError):
        return status(pb.Code.NOT_IMPLEMENTED, text)
    if isinstance(e, RequestTimeoutError):
        return status(pb.Code.PROXY_TIMEOUT, text)
    if isinstance(e, BrokerError) and e.code in _BY_RESPONSE:
        return status(_BY_RESPONSE[e.code], text)
    return status(pb.Code.INTERNAL_SERVER_ERROR, text)
