# POP consumption through one in-process broker over real TCP remoting
# (pop_helpers.pop_bed: serve_broker + name server in this process, the
# Python client's producer and PopClient).
import pytest
import trio

from broker.client import PopStatus
from tests.broker.pop.pop_helpers import pop_bed

G = "pop_cg"
T = "PopT"


async def test_pop_then_ack_hands_each_message_out_once(tmp_path):
    async with pop_bed(tmp_path) as bed:
        await bed.send(T, 8)
        got = []
        while len(got) < 8:
            res = await bed.pc.pop(bed.addr, G, T, max_nums=3, invisible_ms=60000)
            assert res.status is PopStatus.FOUND
            got += res.messages
        bodies = sorted(m.message.body for m in got)
        assert bodies == sorted(f"m{i}".encode() for i in range(8))
        res = await bed.pc.pop(bed.addr, G, T, max_nums=32, invisible_ms=60000)
        assert res.status is PopStatus.POLLING_NOT_FOUND
        for m in got:
            await bed.pc.ack(bed.addr, G, T, m.receipt)
        assert not bed.broker.metadata.state.pop.cks
