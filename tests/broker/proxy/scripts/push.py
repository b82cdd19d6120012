# push.py ENDPOINT AK SK TOPIC GROUP COUNT: a PushConsumer until it has
# consumed COUNT distinct messages (or 60 s); {"result": {"consumed":
# [[id, body, group], ...] in consumption order, "fifo": the server's setting}}.
import sys
import threading

from _common import config, emit
from rocketmq import ConsumeResult, FilterExpression, MessageListener, PushConsumer

endpoint, ak, sk, topic, group, count = sys.argv[1:7]
count = int(count)
consumed, done, lock = [], threading.Event(), threading.Lock()


class Listener(MessageListener):
    def consume(self, message):
        with lock:
            consumed.append([message.message_id, message.body.decode(errors="replace"), message.message_group])
            if len({c[0] for c in consumed}) >= count:
                done.set()
        return ConsumeResult.SUCCESS


consumer = PushConsumer(config(endpoint, ak, sk), group, Listener(), {topic: FilterExpression("*")})
consumer.startup()
done.wait(60)
fifo = consumer.fifo
consumer.shutdown()
emit(result={"consumed": consumed, "fifo": fifo})
