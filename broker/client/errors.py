# Owns the client library's typed errors and the one place where a broker or
# name server response code, or a remoting failure, becomes one of them
# (`check_response`, `from_remoting`).  Everything the library raises on
# purpose is a ClientError.
#
# `retriable` says whether a send may go again (to another queue, after a
# route refresh): Java's DefaultMQProducerImpl retries on the same codes
# (retryResponseCodes: TOPIC_NOT_EXIST, SERVICE_NOT_AVAILABLE, SYSTEM_ERROR,
# NO_PERMISSION, NO_BUYER_ID, NOT_IN_CURRENT_UNIT) and on every remoting
# failure; MESSAGE_ILLEGAL and friends would fail again anywhere.
import itertools

import attrs

from broker.acl.validator import EXCEPTION_PREFIX as _ACL_REFUSAL
from broker.remoting.codes import ResponseCode, code_name
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import (
    RemotingConnectError,
    RemotingConnectionLostError,
    RemotingError,
    RemotingTimeoutError,
)


class ClientError(Exception):
    """Base of every error the client library raises on purpose."""

    retriable = False


class ClientClosedError(ClientError):
    """The producer or consumer was used after it closed."""


class InvalidArgumentError(ClientError, ValueError):
    """An argument or option the client refuses (nothing was sent)."""


class InvalidMessageError(InvalidArgumentError):
    """A message the client refuses before sending it, or one it cannot
    decode."""


@attrs.define(str=False)
class NoRouteError(ClientError):
    """The name servers know no (usable) route for the topic."""

    topic: str
    reason: str = "no route"
    retriable = True

    def __str__(self) -> str:
        return f"topic {self.topic!r}: {self.reason}"


@attrs.define(str=False)
class ConnectionFailedError(ClientError):
    """Could not reach a broker or name server, the call timed out, or the
    connection broke with the request in flight (it may have been applied)."""

    addr: str
    reason: str
    retriable = True

    def __str__(self) -> str:
        return f"{self.addr}: {self.reason}"


class RequestTimeoutError(ConnectionFailedError):
    """No response in time (the request may still be applied)."""


@attrs.define(str=False)
class BrokerError(ClientError):
    """A response whose code says the request failed."""

    addr: str
    code: int
    remark: str | None
    request_code: int | None = None

    def __str__(self) -> str:
        what = f"{code_name(self.request_code)} " if self.request_code is not None else ""
        return f"{what}to {self.addr}: {code_name(self.code, response=True)} {self.remark or ''}".rstrip()


class BrokerUnavailableError(BrokerError):
    """SERVICE_NOT_AVAILABLE: not the master (DLedger leader) now, catching
    up, or shutting down; the route is stale."""

    retriable = True


class BrokerBusyError(BrokerError):
    """SYSTEM_BUSY: backpressure."""

    retriable = True


class TopicNotExistError(BrokerError):
    retriable = True  # Java retries: another broker may have the topic


class NoPermissionError(BrokerError):
    retriable = True


class SystemError_(BrokerError):
    """SYSTEM_ERROR: a generic failure on the broker."""

    retriable = True


# The public name (SystemError_ stays for code that used it).
BrokerSystemError = SystemError_


class AccessDeniedError(BrokerError):
    """The broker's ACL refused the request (RocketMQ answers SYSTEM_ERROR
    with an AclException remark naming what was refused: an unknown access
    key, a bad signature, a topic or group without the permission).  Not
    retried: another broker of the cluster has the same rules."""


class MessageIllegalError(BrokerError):
    """MESSAGE_ILLEGAL: the broker refuses the message (size, topic name)."""


class NotSupportedError(BrokerError):
    """REQUEST_CODE_NOT_SUPPORTED."""


class SubscriptionError(BrokerError):
    """SUBSCRIPTION_* codes on pull."""


_BY_CODE: dict[int, type[BrokerError]] = {
    ResponseCode.SERVICE_NOT_AVAILABLE: BrokerUnavailableError,
    ResponseCode.SYSTEM_BUSY: BrokerBusyError,
    ResponseCode.TOPIC_NOT_EXIST: TopicNotExistError,
    ResponseCode.NO_PERMISSION: NoPermissionError,
    ResponseCode.SYSTEM_ERROR: SystemError_,
    ResponseCode.MESSAGE_ILLEGAL: MessageIllegalError,
    ResponseCode.REQUEST_CODE_NOT_SUPPORTED: NotSupportedError,
    ResponseCode.SUBSCRIPTION_PARSE_FAILED: SubscriptionError,
    ResponseCode.SUBSCRIPTION_NOT_EXIST: SubscriptionError,
    ResponseCode.SUBSCRIPTION_NOT_LATEST: SubscriptionError,
}


def broker_error(addr: str, resp: RemotingCommand, request_code: int | None = None) -> BrokerError:
    if resp.code == ResponseCode.SYSTEM_ERROR and (resp.remark or "").startswith(_ACL_REFUSAL):
        return AccessDeniedError(addr, resp.code, resp.remark, request_code)
    return _BY_CODE.get(resp.code, BrokerError)(addr, resp.code, resp.remark, request_code)


def check_response(resp: RemotingCommand, addr: str, request_code: int | None = None,
                   ok: tuple[int, ...] = (ResponseCode.SUCCESS,)) -> RemotingCommand:
    """`resp` if its code is in `ok`, else the typed BrokerError."""
    if resp.code in ok:
        return resp
    raise broker_error(addr, resp, request_code)


def from_remoting(e: RemotingError, addr: str | None = None) -> ClientError:
    """The ClientError for a remoting-layer failure."""
    if isinstance(e, RemotingTimeoutError):
        return RequestTimeoutError(e.addr or addr or "?", str(e))
    if isinstance(e, (RemotingConnectError, RemotingConnectionLostError)):
        return ConnectionFailedError(e.addr or addr or "?", str(e))
    return ConnectionFailedError(addr or "?", str(e))


@attrs.define(str=False)
class SendFailedError(ClientError):
    """Every attempt of a send failed; `errors` holds each attempt's error."""

    topic: str
    errors: list = attrs.field(factory=list)

    @property
    def last(self) -> ClientError | None:
        return self.errors[-1] if self.errors else None

    def __str__(self) -> str:
        # The same cause three times is said once, with the count.
        runs = [(text, len(list(group))) for text, group in itertools.groupby(str(e) for e in self.errors[-3:])]
        tail = "; ".join(text if n == 1 else f"{text} (x{n})" for text, n in runs)
        return f"send to {self.topic!r} failed after {len(self.errors)} attempt(s): {tail}"
