# What the console's tests share: the wait for a topic created through the
# console to reach the name server (the broker sends its topics with its
# next periodic registration, registerNameServerPeriod >= 10 s).
import trio


async def wait_route(cluster, topic: str, timeout: float = 30.0):
    """The topic's route once a broker has registered it with the name server."""
    with trio.fail_after(timeout):
        while (route := await cluster.namesrv_client().get_route(topic)) is None:
            await trio.sleep(0.2)
    return route
