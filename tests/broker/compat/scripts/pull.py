# pull.py NAMESRV TOPIC [--group G] [--max-num N] [--shutdown]
#         [--access-key AK --secret-key SK [--channel C]]
# PullConsumer.pull(topic): every queue from offset 0 until NO_NEW_MSG.
# Prints {"messages": [{"topic", "queue_id", "queue_offset", "body", "tags",
# "keys", "id"}], "error": null | "..."}.
import argparse

from _common import finish, text
from rocketmq.client import PullConsumer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("namesrv")
    p.add_argument("topic")
    p.add_argument("--group", default="compat_pull")
    p.add_argument("--max-num", type=int, default=32)
    p.add_argument("--shutdown", action="store_true")
    p.add_argument("--access-key", default=None, help="ACL: set_session_credentials(access key, secret, channel)")
    p.add_argument("--secret-key", default="")
    p.add_argument("--channel", default="ALIYUN")
    a = p.parse_args()

    consumer = PullConsumer(a.group)
    consumer.set_namesrv_addr(a.namesrv)
    if a.access_key is not None:
        consumer.set_session_credentials(a.access_key, a.secret_key, a.channel)
    consumer.start()
    messages, error = [], None
    try:
        for m in consumer.pull(a.topic, max_num=a.max_num):
            messages.append({"topic": m.topic, "queue_id": m.queue_id, "queue_offset": m.queue_offset,
                             "body": text(m.body), "tags": text(m.tags), "keys": text(m.keys), "id": m.id})
    except Exception as e:
        error = f"{type(e).__name__}: {text(str(e))}"
    finish({"messages": messages, "error": error}, [consumer], a.shutdown)


main()
