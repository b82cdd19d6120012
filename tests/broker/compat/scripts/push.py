# push.py NAMESRV TOPIC EXPECT [--group G] [--wait S] [--fail-first N] [--shutdown]
#         [--broadcast] [--progress FILE] [--count-prefix P]
# PushConsumer: subscribe, wait until EXPECT distinct bodies arrived or S
# seconds passed.  --fail-first N raises in the callback for the first N
# deliveries (reconsume later).  --broadcast: MessageModel.BROADCASTING.
# --progress FILE: one JSON line per delivery, flushed at once, so a test can
# see the consumer at work before it exits.  --count-prefix P: only bodies
# starting with P count towards EXPECT.  Prints {"messages": [...],
# "deliveries": n, "complete": bool, "seconds": t}.
import argparse
import json
import threading
import time

from _common import finish, text
from rocketmq.client import MessageModel, PushConsumer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("namesrv")
    p.add_argument("topic")
    p.add_argument("expect", type=int)
    p.add_argument("--group", default="compat_push")
    p.add_argument("--wait", type=float, default=60.0)
    p.add_argument("--fail-first", type=int, default=0)
    p.add_argument("--shutdown", action="store_true")
    p.add_argument("--broadcast", action="store_true")
    p.add_argument("--progress")
    p.add_argument("--count-prefix", default="")
    a = p.parse_args()
    progress = open(a.progress, "a") if a.progress else None

    lock, done = threading.Lock(), threading.Event()
    messages, bodies, state = [], set(), {"deliveries": 0}

    def on_message(m):
        with lock:
            state["deliveries"] += 1
            if state["deliveries"] <= a.fail_first:
                raise RuntimeError("compat: reconsume later")
            body = text(m.body)
            messages.append({"topic": m.topic, "queue_id": m.queue_id, "queue_offset": m.queue_offset,
                             "body": body, "tags": text(m.tags), "id": m.id,
                             "reconsume_times": m.reconsume_times})
            if progress is not None:
                progress.write(json.dumps({"body": body, "queue_id": m.queue_id}) + "\n")
                progress.flush()
            if body.startswith(a.count_prefix):
                bodies.add(body)
            if len(bodies) >= a.expect:
                done.set()

    consumer = PushConsumer(a.group, message_model=MessageModel.BROADCASTING if a.broadcast
                            else MessageModel.CLUSTERING)
    consumer.set_namesrv_addr(a.namesrv)
    consumer.subscribe(a.topic, on_message)
    t0 = time.monotonic()
    consumer.start()
    done.wait(a.wait)
    with lock:
        result = {"messages": list(messages), "deliveries": state["deliveries"], "complete": done.is_set(),
                  "seconds": round(time.monotonic() - t0, 3)}
    finish(result, [consumer], a.shutdown)


main()
