# Owns the catalogue of RocketMQ's own .conf keys that ledgermq does not
# parse, split by what ignoring them means for an operator:
#
#   NO_EFFECT        sizing and tuning knobs of RocketMQ's Java/Netty
#                    implementation, and keys RocketMQ itself ignores in
#                    DLedger mode (brokerRole, storePathCommitLog, ...):
#                    accepted silently, so the sample configs RocketMQ ships
#                    load without noise
#   NOT_IMPLEMENTED  features an operator may rely on that ledgermq does
#                    not have (message traces, transactions' check
#                    loop, POP, timer wheel, controller mode, ...): accepted
#                    with a warning that names the key
#
# Anything in neither list nor parsed by ledgermq is an unknown key: a
# warning with "did you mean" (suggest()), never a failure, as RocketMQ
# itself ignores unknown keys.
import difflib

NO_EFFECT = frozenset({
    # Java thread pools and queues
    "sendMessageThreadPoolNums", "pullMessageThreadPoolNums", "queryMessageThreadPoolNums",
    "adminBrokerThreadPoolNums", "clientManageThreadPoolNums", "consumerManageThreadPoolNums",
    "heartbeatThreadPoolNums", "endTransactionThreadPoolNums", "processReplyMessageThreadPoolNums",
    "litePullMessageThreadPoolNums", "sendThreadPoolQueueCapacity", "pullThreadPoolQueueCapacity",
    "queryThreadPoolQueueCapacity", "clientManagerThreadPoolQueueCapacity",
    "consumerManagerThreadPoolQueueCapacity", "heartbeatThreadPoolQueueCapacity",
    "endTransactionPoolQueueCapacity", "useReentrantLockWhenPutMessage", "waitTimeMillsInSendQueue",
    "waitTimeMillsInPullQueue", "waitTimeMillsInHeartbeatQueue", "brokerFastFailureEnable",
    "osPageCacheBusyTimeOutMills",
    # Netty
    "serverWorkerThreads", "serverCallbackExecutorThreads", "serverSelectorThreads",
    "serverOnewaySemaphoreValue", "serverAsyncSemaphoreValue",
    "serverSocketSndBufSize", "serverSocketRcvBufSize", "serverPooledByteBufAllocatorEnable",
    "useEpollNativeSelector", "clientWorkerThreads", "clientCallbackExecutorThreads",
    "clientCloseSocketIfTimeout", "serverSocketBacklog",
    # page cache / mmap tuning of the Java store
    "transientStorePoolEnable", "transientStorePoolSize", "transferMsgByHeap", "warmMapedFileEnable",
    "flushCommitLogLeastPages", "flushConsumeQueueLeastPages", "flushIntervalConsumeQueue",
    "flushCommitLogThoroughInterval", "flushConsumeQueueThoroughInterval", "commitIntervalCommitLog",
    "commitCommitLogLeastPages", "commitCommitLogThoroughInterval", "flushLeastPagesWhenWarmMapedFile",
    "maxTransferBytesOnMessageInMemory", "maxTransferCountOnMessageInMemory",
    "maxTransferBytesOnMessageInDisk", "maxTransferCountOnMessageInDisk", "accessMessageInMemoryMaxRatio",
    "cleanFileForciblyEnable", "cleanResourceInterval", "deleteCommitLogFilesInterval",
    "deleteConsumeQueueFilesInterval", "destroyMapedFileIntervalForcibly", "redeleteHangedFileInterval",
    "mappedFileSizeConsumeQueue", "mapedFileSizeConsumeQueue", "mappedFileSizeConsumeQueueExt",
    "checkCRCOnRecover", "fastFailIfNoBufferInStorePool",
    # paths and roles RocketMQ itself ignores in DLedger mode
    "brokerRole", "storePathCommitLog", "storePathConsumeQueue", "storeCheckpoint", "abortFile",
    "haListenPort", "haMasterAddress", "haSendHeartbeatInterval", "haHousekeepingInterval",
    "haTransferBatchSize", "haSlaveFallbehindMax", "brokerIP2", "enableDLegerCommitLog",
    # process environment
    "fetchNamesrvAddrByAddressServer", "namesrvAddrAddressServerUrl", "kvConfigPath",
    "configStorePath", "productEnvName", "clusterTest", "storePathEpochFile",
})

NOT_IMPLEMENTED = frozenset({
    "traceTopicEnable", "msgTraceTopicName", "traceOn",
    "enablePropertyFilter", "filterSupportRetry", "enableCalcFilterBitMap", "filterServerNums",
    "slaveReadEnable", "longPollingEnable", "shortPollingTimeMills", "notifyConsumerIdsChangedEnable",
    "rejectTransactionMessage", "transactionTimeOut", "transactionCheckMax", "transactionCheckInterval",
    "messageIndexSafe", "maxHashSlotNum", "maxIndexNum", "duplicationEnable", "brokerTopicEnable",
    "clusterTopicEnable", "startAcceptSendRequestTimeStamp", "enableSlaveActingMaster",
    "enableControllerMode", "controllerAddr", "storeType", "timerWheelEnable", "enablePopLog",
    "enablePopBufferMerge", "enableScheduleMessageStats", "enableLmq", "enableMultiDispatch",
    "metricsGrpcExporterTarget", "metricsGrpcExporterHeader", "metricsLabel", "metricsInDelta",
    "brokerNotActiveTimeoutMillis", "compatibleWithOldNameSrv", "enableDetailStat", "isolateLogEnable",
    "autoDeleteUnusedStats", "messageStorePlugIn", "maxDelayTime",
})

ALL = NO_EFFECT | NOT_IMPLEMENTED


def suggest(key: str, candidates) -> str | None:
    """The known key `key` is most likely a typo of, if any."""
    hit = difflib.get_close_matches(key, list(candidates), n=1, cutoff=0.75)
    if hit:
        return hit[0]
    lower = {c.lower(): c for c in candidates}  # brokername -> brokerName
    return lower.get(key.lower())


def unknown_key_warning(key: str, candidates) -> str:
    hint = suggest(key, candidates)
    return f"unknown key {key!r} ignored" + (f" (did you mean {hint!r}?)" if hint else "")


def not_implemented_warning(key: str) -> str:
    return f"{key} is a RocketMQ key ledgermq does not implement; ignored"
