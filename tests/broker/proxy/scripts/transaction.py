# transaction.py ENDPOINT AK SK TOPIC: three transactional messages with the
# official Producer: one committed, one rolled back, one left unresolved
# whose check (recover_orphaned_transaction_command) the checker answers
# COMMIT.  {"result": {"commit": id, "rollback": id, "unknown": id, "checked": [...]}}.
import sys
import threading

from _common import config, emit
from rocketmq import Message, Producer, TransactionChecker, TransactionResolution

endpoint, ak, sk, topic = sys.argv[1:5]
checked, seen = [], threading.Event()


class Checker(TransactionChecker):
    def check(self, message):
        checked.append(message.message_id)
        seen.set()
        return TransactionResolution.COMMIT


producer = Producer(config(endpoint, ak, sk), (topic,), Checker())
producer.startup()
ids = {}
for what in ("commit", "rollback", "unknown"):
    tx = producer.begin_transaction()
    msg = Message()
    msg.topic = topic
    msg.body = what.encode()
    receipt = producer.send(msg, tx)
    ids[what] = receipt.message_id
    if what == "commit":
        tx.commit()
    elif what == "rollback":
        tx.rollback()
ok = seen.wait(60)  # the broker checks an unresolved half after transactionTimeOut
producer.shutdown()
emit(result={**ids, "checked": checked, "check_seen": ok})
