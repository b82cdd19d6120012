# The ledgermq Python client library (RocketMQ 4.x protocol) on anyio, so it runs
# under asyncio and trio alike: open_producer, open_transactional_producer,
# open_push_consumer (clustering, orderly or broadcasting), open_pull_consumer;
# the blocking facade for non-async code is in broker.client.blocking.  See
# README "Python client".
from broker.acl.signing import Credentials
from broker.client.errors import (
                                  AccessDeniedError,
                                  BrokerBusyError,
                                  BrokerError,
                                  BrokerSystemError,
                                  BrokerUnavailableError,
                                  ClientClosedError,
                                  ClientError,
                                  ConnectionFailedError,
                                  InvalidArgumentError,
                                  InvalidMessageError,
                                  MessageIllegalError,
                                  NoPermissionError,
                                  NoRouteError,
                                  NotSupportedError,
                                  RequestTimeoutError,
                                  SendFailedError,
                                  SubscriptionError,
                                  SystemError_,
                                  TopicNotExistError,
)
from broker.client.model import (
                                  ConsumeStatus,
                                  Message,
                                  MessageExt,
                                  MessageQueue,
                                  MessageSelector,
                                  PullResult,
                                  PullStatus,
                                  SendResult,
                                  SendStatus,
)
from broker.client.pop import PopClient, PopMessage, PopResult, PopStatus, open_pop_client
from broker.client.producer import Producer, open_producer
from broker.client.pull_consumer import PullConsumer, open_pull_consumer
from broker.client.push_consumer import PushConsumer, PushOptions, open_push_consumer
from broker.client.rebalance import allocate_averagely
from broker.client.transaction import (
                                       LocalTransactionState,
                                       TransactionalProducer,
                                       TransactionSendResult,
                                       open_transactional_producer,
)
from broker.common.values import ConsumeFromWhere, MessageModel

__all__ = [
    "AccessDeniedError", "Credentials",
    "BrokerBusyError", "BrokerError", "BrokerSystemError", "BrokerUnavailableError", "ClientClosedError", "ClientError",
    "ConnectionFailedError", "ConsumeFromWhere", "ConsumeStatus", "InvalidArgumentError", "InvalidMessageError",
    "Message", "MessageExt", "MessageIllegalError", "MessageQueue", "MessageSelector", "NoPermissionError",
    "NoRouteError", "NotSupportedError", "Producer", "PullConsumer",
    "PullResult", "PullStatus", "PushConsumer", "PushOptions", "RequestTimeoutError", "SendFailedError",
    "SendResult", "SendStatus", "SubscriptionError", "SystemError_", "TopicNotExistError", "allocate_averagely",
    "open_producer", "open_pull_consumer", "open_push_consumer", "LocalTransactionState", "MessageModel",
    "TransactionSendResult", "TransactionalProducer", "open_transactional_producer",
    "PopClient", "PopMessage", "PopResult", "PopStatus", "open_pop_client",
]
