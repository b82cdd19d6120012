# One SparkSession for every pipeline test (Spark starts in 5-10 s; the
# jobs then take a second or two each), stopped when this package's tests
# are done so its JVM does not sit beside the rest of the suite: local[2],
# UI off, two shuffle partitions, scratch space under pytest's tmp dir.
# Every JVM these tests start (the session's, mqadmin's and spark-submit's
# drivers, the standalone daemons) runs with C1 only (QUICK_JVM through
# JAVA_TOOL_OPTIONS, for this package's tests only): their jobs last
# seconds, and C2's compiles never pay off on the shared 2-core machine.
import os

import pytest


@pytest.fixture(scope="session")
def java():
    from tools.pipeline.sparkenv import find_java
    path = find_java()
    if path is None:
        pytest.skip("no Java runtime on this machine (JAVA_HOME/PATH): the Spark pipeline needs one")
    return path


QUICK_JVM = "-XX:TieredStopAtLevel=1"


@pytest.fixture(scope="package", autouse=True)
def quick_jvms():
    """C1 only for every JVM started while this package's tests run (with
    C2: the two crash reruns, the two command-line runs and the session's
    start took 154 s, 91 s without)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JAVA_TOOL_OPTIONS", f"{os.environ.get('JAVA_TOOL_OPTIONS', '')} {QUICK_JVM}".strip())
        yield


@pytest.fixture(scope="package")
def spark(java, tmp_path_factory):
    from tools.pipeline.sparkenv import build_session, stop_session
    os.environ["LEDGERMQ_SPARK_LOCAL_DIR"] = str(tmp_path_factory.mktemp("spark-local"))
    session = build_session("local[2]", {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
                                         "spark.driver.memory": "1g"})
    yield session
    stop_session(session)
