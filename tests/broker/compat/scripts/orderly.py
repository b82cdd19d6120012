# orderly.py NAMESRV TOPIC KEYS PER_KEY [--group G] [--wait S] [--fail-first N] [--no-send]
#            [--progress FILE]
# The stock client's orderly paths: Producer.send_orderly(msg, key index)
# sends PER_KEY messages "k<key>:<seq>" for each of KEYS keys (unless
# --no-send), then PushConsumer(group, orderly=True) consumes until every
# expected body arrived or S seconds passed.  --fail-first N raises in the
# callback for the first N deliveries (0.4.4's orderly consumer then moves on
# past them, committing their offsets: a client-side matter, nothing reaches
# the broker).  --progress FILE: one JSON line per delivery, flushed at once,
# so a test can see the consumer at work before it exits.  Prints {"sent":
# [...], "consumed": [...], "complete": bool}.
import argparse
import json
import threading
import time

from _common import finish, text
from rocketmq.client import Message, Producer, PushConsumer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("namesrv")
    p.add_argument("topic")
    p.add_argument("keys", type=int)
    p.add_argument("per_key", type=int)
    p.add_argument("--group", default="compat_orderly")
    p.add_argument("--wait", type=float, default=60.0)
    p.add_argument("--fail-first", type=int, default=0)
    p.add_argument("--no-send", action="store_true")
    p.add_argument("--progress")
    a = p.parse_args()
    progress = open(a.progress, "a") if a.progress else None

    sent = []
    clients = []
    if not a.no_send:
        producer = Producer(a.group + "_producer")
        producer.set_namesrv_addr(a.namesrv)
        producer.start()
        clients.append(producer)
        for seq in range(a.per_key):
            for key in range(a.keys):
                msg = Message(a.topic)
                msg.set_tags("Ordered")
                msg.set_body(f"k{key}:{seq}")
                r = producer.send_orderly(msg, key)
                sent.append({"key": key, "seq": seq, "status": r.status.name, "msg_id": r.msg_id})

    lock, done = threading.Lock(), threading.Event()
    consumed, bodies, state = [], set(), {"deliveries": 0}
    expect = a.keys * a.per_key

    def on_message(m):
        with lock:
            state["deliveries"] += 1
            body = text(m.body)
            consumed.append({"body": body, "queue_id": m.queue_id, "queue_offset": m.queue_offset,
                             "reconsume_times": m.reconsume_times, "failed": state["deliveries"] <= a.fail_first})
            if progress is not None:
                progress.write(json.dumps({"body": body, "queue_id": m.queue_id}) + "\n")
                progress.flush()
            if state["deliveries"] <= a.fail_first:
                raise RuntimeError("compat: suspend and retry")
            bodies.add(body)
            if len(bodies) >= expect:
                done.set()

    consumer = PushConsumer(a.group, orderly=True)
    consumer.set_namesrv_addr(a.namesrv)
    consumer.subscribe(a.topic, on_message)
    t0 = time.monotonic()
    consumer.start()
    clients.append(consumer)
    done.wait(a.wait)
    with lock:
        result = {"sent": sent, "consumed": list(consumed), "complete": done.is_set(),
                  "seconds": round(time.monotonic() - t0, 3)}
    finish(result, clients, False)


main()
