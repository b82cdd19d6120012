# Owns the typed errors of the RocketMQ remoting layer.
#
# Protocol errors are split by whose fault they are, as in h11:
#   LocalProtocolError  - we tried to encode something the wire cannot carry
#                         (a code above 32767 in a ROCKETMQ header, a frame
#                         over the size limit); a bug or a bad argument here.
#   RemoteProtocolError - the peer sent bytes that are not a command; the
#                         stream has lost its frame boundaries (or its header
#                         is garbage), so that one connection must close.  It
#                         carries the request's opaque when it could be read,
#                         so the server can still answer before closing.
# Connection errors are what RemotingClient.invoke() raises: it could not
# connect, the reply did not come in time, or the connection broke with the
# request in flight (which may or may not have been processed).
# RequestError is raised by request handlers to answer with a specific code.
import attrs

from broker.remoting.codes import code_name


class RemotingError(Exception):
    """Base of every error the remoting layer raises on purpose."""


class ProtocolError(RemotingError, ValueError):
    pass


class LocalProtocolError(ProtocolError):
    """A command that cannot be encoded (field out of range, frame too big)."""


@attrs.define(str=False)
class RemoteProtocolError(ProtocolError):
    """Bytes from the peer that are not a well-formed remoting frame."""

    reason: str
    # Known when the header was readable enough to find them: lets the
    # server send a SYSTEM_ERROR response before it closes the connection.
    opaque: int | None = None
    serialize_type: int | None = None

    def __str__(self) -> str:
        return self.reason


@attrs.define(str=False)
class RemotingConnectError(RemotingError):
    """Could not open a connection to `addr`."""

    addr: str
    reason: str

    def __str__(self) -> str:
        return f"connect to {self.addr} failed: {self.reason}"


@attrs.define(str=False)
class RemotingTimeoutError(RemotingError):
    """No response to request `code` within `timeout` seconds."""

    addr: str
    code: int
    timeout: float
    silent: bool = False  # nothing at all has come back on the connection since it opened

    def __str__(self) -> str:
        text = f"no response from {self.addr} within {self.timeout:g} s to {code_name(self.code)}"
        if self.silent:
            text += (" (the port accepted the connection but has sent nothing back: it may not speak "
                     "RocketMQ remoting, e.g. a metrics or other service's port)")
        return text


@attrs.define(str=False)
class RemotingConnectionLostError(RemotingError):
    """The connection broke before the response arrived; the request may or
    may not have been processed by the peer."""

    addr: str
    reason: str

    def __str__(self) -> str:
        hint = " (the peer does not speak RocketMQ remoting)" if self.reason.startswith("malformed frame") else ""
        return f"connection to {self.addr} lost: {self.reason}{hint}"


@attrs.define(str=False)
class RequestError(RemotingError):
    """Raised by a request handler: the server answers with `code` and
    `remark` (e.g. a header field that is missing or does not parse)."""

    code: int
    remark: str

    def __str__(self) -> str:
        return f"code {self.code}: {self.remark}"


@attrs.define(str=False)
class ResponseError(RemotingError):
    """A response whose code says the request failed (raised by helpers that
    expect SUCCESS, e.g. the name server API)."""

    addr: str
    code: int
    remark: str | None

    def __str__(self) -> str:
        return f"{self.addr} answered code {self.code}: {self.remark or '(no remark)'}"
