# Owns the numbers of the remoting protocol (spec §8): request codes
# (RequestCode.java), response codes (RemotingSysResponseCode + ResponseCode),
# LanguageCode, SerializeType, the flag bits and the MQVersion ordinals we
# use.  Names are RocketMQ's so that grepping upstream finds them.
#
# RemotingCommand.code stays a plain int: a peer may send codes that are not
# listed here, and those must reach the handler (which answers
# REQUEST_CODE_NOT_SUPPORTED) rather than fail decoding.
import enum

# flag bits
RPC_TYPE_RESPONSE = 1 << 0
RPC_ONEWAY = 1 << 1
# ledgermq's own: a write one broker of a group handed on to its master
# (broker/processors/forward.py); the master never hands it on again.
FORWARDED_WRITE = 1 << 8

# MQVersion.Version ordinals (spec §8.1).  From V4_9_4 on, the name server
# answers GET_ROUTEINFO_BY_TOPIC in standard JSON; ledgermq always does.
V4_9_4 = 401
V5_3_3 = 479
CURRENT_VERSION = V5_3_3


class SerializeType(enum.IntEnum):
    JSON = 0
    ROCKETMQ = 1


class LanguageCode(enum.IntEnum):
    JAVA = 0
    CPP = 1
    DOTNET = 2
    PYTHON = 3
    DELPHI = 4
    ERLANG = 5
    RUBY = 6
    OTHER = 7
    HTTP = 8
    GO = 9
    PHP = 10
    OMS = 11
    RUST = 12
    NODE_JS = 13


class RequestCode(enum.IntEnum):
    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_BROKER_OFFSET = 13
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    GET_TOPIC_CONFIG_LIST = 22
    GET_TOPIC_NAME_LIST = 23
    UPDATE_BROKER_CONFIG = 25
    GET_BROKER_CONFIG = 26
    TRIGGER_DELETE_FILES = 27
    GET_BROKER_RUNTIME_INFO = 28
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39
    NOTIFY_CONSUMER_IDS_CHANGED = 40
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    GET_ALL_CONSUMER_OFFSET = 43
    GET_ALL_DELAY_OFFSET = 45
    CHECK_CLIENT_CONFIG = 46
    PUT_KV_CONFIG = 100
    GET_KV_CONFIG = 101
    DELETE_KV_CONFIG = 102
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
    GET_TOPIC_STATS_INFO = 202
    GET_CONSUMER_CONNECTION_LIST = 203
    GET_PRODUCER_CONNECTION_LIST = 204
    WIPE_WRITE_PERM_OF_BROKER = 205
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    DELETE_SUBSCRIPTIONGROUP = 207
    GET_CONSUME_STATS = 208
    DELETE_TOPIC_IN_BROKER = 215
    DELETE_TOPIC_IN_NAMESRV = 216
    REGISTER_TOPIC_IN_NAMESRV = 217
    GET_KVLIST_BY_NAMESPACE = 219
    GET_TOPICS_BY_CLUSTER = 224
    QUERY_TOPIC_CONSUME_BY_WHO = 300
    QUERY_CONSUME_TIME_SPAN = 303
    GET_SYSTEM_TOPIC_LIST_FROM_NS = 304
    GET_SYSTEM_TOPIC_LIST_FROM_BROKER = 305
    CLEAN_EXPIRED_CONSUMEQUEUE = 306
    GET_CONSUMER_RUNNING_INFO = 307
    QUERY_CORRECTION_OFFSET = 308
    CONSUME_MESSAGE_DIRECTLY = 309
    SEND_MESSAGE_V2 = 310
    CLONE_GROUP_OFFSET = 314
    VIEW_BROKER_STATS_DATA = 315
    CLEAN_UNUSED_TOPIC = 316
    GET_BROKER_CONSUME_STATS = 317
    UPDATE_NAMESRV_CONFIG = 318
    GET_NAMESRV_CONFIG = 319
    SEND_BATCH_MESSAGE = 320
    QUERY_CONSUME_QUEUE = 321
    QUERY_DATA_VERSION = 322
    SEND_REPLY_MESSAGE = 324
    SEND_REPLY_MESSAGE_V2 = 325
    PUSH_REPLY_MESSAGE_TO_CLIENT = 326
    ADD_WRITE_PERM_OF_BROKER = 327
    GET_ALL_PRODUCER_INFO = 328
    GET_TOPIC_CONFIG = 351
    LITE_PULL_MESSAGE = 361
    QUERY_ASSIGNMENT = 400
    SET_MESSAGE_REQUEST_MODE = 401
    GET_BROKER_MEMBER_GROUP = 901
    BROKER_HEARTBEAT = 904
    RESET_CONSUMER_CLIENT_OFFSET = 220
    INVOKE_BROKER_TO_RESET_OFFSET = 222
    # ledgermq's own codes (9100..9199: unused by RocketMQ 4.x/5.x), for
    # mqadmin's replication commands (broker/processors/admin_dledger.py):
    #   LEDGERMQ_DLEDGER_STATUS      body: JSON of ReplicaNode.status() + the broker's id/addr
    #   LEDGERMQ_TRANSFER_LEADERSHIP header targetId (a dLegerSelfId); sent to the leader
    #   LEDGERMQ_CHAIN_CRC           header index; answer fields chainCrc, committedIndex
    LEDGERMQ_DLEDGER_STATUS = 9100
    LEDGERMQ_TRANSFER_LEADERSHIP = 9101
    LEDGERMQ_CHAIN_CRC = 9102
    #   LEDGERMQ_CHANGE_MEMBERSHIP   header change (addLearner|promote|remove), peerId, peerAddr
    #                                (addLearner), timeoutMillis; sent to the leader; answer fields
    #                                configIndex, voters, learners (comma-separated)
    LEDGERMQ_CHANGE_MEMBERSHIP = 9103
    # RocketMQ 5's POP consumption (broker/processors/pop.py).  Above
    # 32767: they travel only in JSON headers (a ROCKETMQ binary header's
    # i16 code cannot hold them; encoding one refuses, and a Java client's
    # binary header would arrive truncated, e.g. 200050 as 3442, a code
    # nobody serves: REQUEST_CODE_NOT_SUPPORTED).
    POP_MESSAGE = 200050
    ACK_MESSAGE = 200051
    CHANGE_MESSAGE_INVISIBLETIME = 200053
    BATCH_ACK_MESSAGE = 200151
    # RocketMQ 5.3's timer-message recall (RecallMessageRequestHeader).
    RECALL_MESSAGE = 370


class ResponseCode(enum.IntEnum):
    # RemotingSysResponseCode
    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    TRANSACTION_FAILED = 4
    # ResponseCode
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    TOPIC_EXIST_ALREADY = 18
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    FILTER_DATA_NOT_EXIST = 27
    FILTER_DATA_NOT_LATEST = 28
    INVALID_PARAMETER = 29
    TRANSACTION_SHOULD_COMMIT = 200
    TRANSACTION_SHOULD_ROLLBACK = 201
    TRANSACTION_STATE_UNKNOW = 202
    TRANSACTION_STATE_GROUP_WRONG = 203
    NO_BUYER_ID = 204
    NOT_IN_CURRENT_UNIT = 205
    CONSUMER_NOT_ONLINE = 206
    CONSUME_MSG_TIMEOUT = 207
    NO_MESSAGE = 208
    POLLING_FULL = 209
    POLLING_TIMEOUT = 210
    BROKER_NOT_EXIST = 211
    BROKER_DISPATCH_NOT_COMPLETE = 212
    BROADCAST_CONSUMPTION = 213
    FLOW_CONTROL = 215
    NOT_LEADER_FOR_QUEUE = 501
    ILLEGAL_OPERATION = 604
    GO_AWAY = 1500


def code_name(code: int, response: bool = False) -> str:
    """`GET_ROUTEINFO_BY_TOPIC(105)` for logs; unknown codes as plain numbers."""
    enum_type = ResponseCode if response else RequestCode
    try:
        return f"{enum_type(code).name}({code})"
    except ValueError:
        return str(code)
