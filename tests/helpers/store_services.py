# Owns building the store services (delay levels, timers, transaction
# checks) over one test node's BrokerStore with the collaborators the
# composition root (broker/server.py wire_processors) hands them, so tests
# wire them the same way.
from broker.store.schedule import ScheduleService
from broker.store.timer import TimerService
from broker.store.transaction import CheckBack, TransactionService


def schedule_service(bs, cfg, **kw) -> ScheduleService:
    return ScheduleService(cfg=cfg, gate=bs.gate, metadata=bs.metadata, replica=bs.replica, cq=bs.cq,
                           queues=bs.cq.engine, arrivals=bs.cq.dispatcher.arrivals, **kw)


def timer_service(bs, cfg, **kw) -> TimerService:
    return TimerService(cfg=cfg, gate=bs.gate, metadata=bs.metadata, replica=bs.replica, store=bs.store, cq=bs.cq,
                        queues=bs.cq.engine, arrivals=bs.cq.dispatcher.arrivals,
                        dispatched=bs.cq.dispatcher.dispatched, **kw)


def transaction_service(bs, cfg, check_back: CheckBack, **kw) -> TransactionService:
    return TransactionService(cfg=cfg, gate=bs.gate, metadata=bs.metadata, replica=bs.replica, store=bs.store,
                              cq=bs.cq, queues=bs.cq.engine, arrivals=bs.cq.dispatcher.arrivals,
                              check_back=check_back, **kw)
