# The client library runs under asyncio and trio (anyio): tests marked
# `anyio` run once per backend through anyio's pytest plugin.  pytest-trio's
# trio_mode marks every async test as a trio test; that mark is taken off the
# anyio ones here (after pytest-trio added it), so they really run on asyncio
# too.  Unmarked tests keep running on trio as before.
import pytest


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("anyio") is not None:
            item.own_markers = [m for m in item.own_markers if m.name != "trio"]


pytest_collection_modifyitems = pytest.hookimpl(trylast=True)(pytest_collection_modifyitems)


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    return request.param
