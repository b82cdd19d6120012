# acl_consumer.py NAMESRV TOPIC EXPECT --group G --access-key AK --secret-key SK [--orderly]
#                 [--fail-first N] [--wait S] [--channel C]
# A PushConsumer (orderly: it locks its queues with LOCK_BATCH_MQ) signing
# with set_session_credentials, until EXPECT distinct bodies arrived or S
# seconds passed.  --fail-first N raises in the callback for the first N
# deliveries: a concurrent consumer then sends each back
# (CONSUMER_SEND_MSG_BACK) and gets it again from %RETRY%<group>.  Prints
# {"messages": [...], "deliveries": n, "complete": bool}.
import argparse
import threading

from _common import finish, text
from rocketmq.client import PushConsumer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("namesrv")
    p.add_argument("topic")
    p.add_argument("expect", type=int)
    p.add_argument("--group", required=True)
    p.add_argument("--access-key", required=True)
    p.add_argument("--secret-key", required=True)
    p.add_argument("--channel", default="ALIYUN")
    p.add_argument("--orderly", action="store_true")
    p.add_argument("--fail-first", type=int, default=0)
    p.add_argument("--wait", type=float, default=60.0)
    a = p.parse_args()

    lock, done = threading.Lock(), threading.Event()
    messages, bodies, state = [], set(), {"deliveries": 0}

    def on_message(m):
        with lock:
            state["deliveries"] += 1
            body = text(m.body)
            messages.append({"body": body, "reconsume_times": m.reconsume_times, "queue_id": m.queue_id})
            if state["deliveries"] <= a.fail_first:
                raise RuntimeError("compat: reconsume later")
            bodies.add(body)
            if len(bodies) >= a.expect:
                done.set()

    consumer = PushConsumer(a.group, orderly=a.orderly)
    consumer.set_namesrv_addr(a.namesrv)
    consumer.set_session_credentials(a.access_key, a.secret_key, a.channel)
    consumer.subscribe(a.topic, on_message)
    consumer.start()
    done.wait(a.wait)
    with lock:
        result = {"messages": list(messages), "deliveries": state["deliveries"], "complete": done.is_set()}
    finish(result, [consumer], False)


main()
