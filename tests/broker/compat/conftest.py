# The compat venv (stock rocketmq==0.4.4 client) for tests/compat: built on
# first use by stock_client.ensure_venv (a few seconds: venv + pip from
# PyPI), reused afterwards.  Tests skip only when the venv cannot be built
# or librocketmq.so does not load, with the failing step as the reason; a
# protocol problem on our side is always a failure.
import pytest

from tests.broker.compat.stock_client import PACKAGE, StockClientUnavailable, ensure_venv


@pytest.fixture(scope="session")
def stock_client(request):
    try:
        venv = ensure_venv()
    except StockClientUnavailable as e:
        pytest.skip(f"stock client {PACKAGE} unavailable: {e}")
    if venv.created:
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"\n[compat] built {venv.python.parent.parent} ({PACKAGE}) "
                                f"in {venv.setup_seconds:.1f} s (first run only)")
    return venv
