# Owns RequestProcessor, the base every request processor of the broker
# shares: registering its request codes with the dispatcher, routing a code
# to its handler, and the one place where broker errors (not leader, bad
# metadata, storage) become RocketMQ response codes.
from broker.common.values import InvalidMetadataError
from broker.remoting.codes import ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RequestError
from commitlog.errors import CommitLogError, NotLeaderError


class RequestProcessor:
    """Base of the request processors: routes each request code to a method
    (`handlers()`: code -> async method taking the request; a processor that
    needs the connection overrides `handle`), and is their one translation
    point from broker errors to response codes.  Subclasses set CODES and may
    adjust the two settings.  A oneway request gets no response."""

    CODES: tuple = ()
    # What a follower's refusal says before the leader hint (None: the hint alone).
    not_leader_remark: str | None = None
    # Storage errors: the node cannot serve it now (SERVICE_NOT_AVAILABLE)
    # or the request itself failed (SYSTEM_ERROR).
    commitlog_error_code: int = ResponseCode.SERVICE_NOT_AVAILABLE

    def handlers(self) -> dict:
        raise NotImplementedError

    def register(self, dispatcher) -> None:
        for code in self.CODES:
            dispatcher.register(code, self)

    async def handle(self, conn, request: RemotingCommand) -> RemotingCommand:
        return await self.handlers()[request.code](request)

    async def __call__(self, conn, request: RemotingCommand) -> RemotingCommand | None:
        try:
            response = await self.handle(conn, request)
        except RequestError as e:
            response = request.make_response(e.code, e.remark)
        except NotLeaderError as e:
            remark = f"{self.not_leader_remark}: {e}" if self.not_leader_remark else str(e)
            response = request.make_response(ResponseCode.SERVICE_NOT_AVAILABLE, remark)
        except InvalidMetadataError as e:
            response = request.make_response(ResponseCode.SYSTEM_ERROR, str(e))
        except CommitLogError as e:
            response = request.make_response(self.commitlog_error_code, str(e))
        return None if request.is_oneway else response
