# push.py ENDPOINT AK SK TOPIC GROUP COUNT|@IDS_FILE: a PushConsumer until it
# has consumed COUNT distinct messages, or every message id listed in
# IDS_FILE once the test has written it (90 s at most); {"result":
# {"consumed": [[id, body, group, attempt], ...] in consumption order,
# "fifo": the server's setting, "complete": ...}}.
import json
import os
import sys
import threading
import time

from _common import config, emit
from rocketmq import ConsumeResult, FilterExpression, MessageListener, PushConsumer

endpoint, ak, sk, topic, group, target = sys.argv[1:7]
consumed, lock, changed = [], threading.Lock(), threading.Event()


class Listener(MessageListener):
    def consume(self, message):
        with lock:
            consumed.append([message.message_id, message.body.decode(errors="replace"), message.message_group,
                             message.delivery_attempt])
        changed.set()
        return ConsumeResult.SUCCESS


def complete() -> bool:
    with lock:
        ids = {c[0] for c in consumed}
    if not target.startswith("@"):
        return len(ids) >= int(target)
    if not os.path.exists(target[1:]):
        return False
    with open(target[1:]) as f:
        return set(json.load(f)) <= ids


consumer = PushConsumer(config(endpoint, ak, sk), group, Listener(), {topic: FilterExpression("*")})
consumer.startup()
deadline = time.monotonic() + 90
done = complete()
while not done and time.monotonic() < deadline:
    changed.wait(1.0)  # a consumed message, or a second to look at the ids file again
    changed.clear()
    done = complete()
fifo = consumer.fifo
consumer.shutdown()
emit(result={"consumed": consumed, "fifo": fifo, "complete": done})
