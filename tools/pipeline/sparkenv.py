# Owns the Spark side of the driver: finding Java (a one-line error when it
# is missing instead of PySpark's gateway traceback), the SparkSession with
# local defaults, and the rich progress display fed by Spark's status
# tracker.
#
# Defaults are for one machine and small-to-medium stores: `local[*]`, a
# handful of shuffle partitions (the jobs shuffle only per-queue aggregates),
# 2 GiB of driver memory (the rebuild replays compact records there), no
# Spark console progress bar (ours replaces it), scratch space under
# $LEDGERMQ_SPARK_LOCAL_DIR or the system temp directory.  Everything can be
# overridden with --conf key=value; under spark-submit the session is the
# one spark-submit configured and only our unset keys are added.
import os
import shutil
import sys
import tempfile
import threading

DEFAULT_MASTER = "local[*]"
DEFAULT_CONF = {
    "spark.sql.shuffle.partitions": "8",
    "spark.default.parallelism": None,  # Spark's own: the cores of the master
    "spark.driver.memory": "2g",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",  # the export's date partition is a UTC date
    "spark.python.worker.reuse": "true",
}


class JavaMissingError(RuntimeError):
    """No Java runtime for Spark's JVM."""


def find_java() -> str | None:
    """The java binary Spark's launcher would run: $JAVA_HOME/bin/java when
    JAVA_HOME is set, else java on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        path = os.path.join(home, "bin", "java")
        return path if os.access(path, os.X_OK) else None
    return shutil.which("java")


def under_spark_submit() -> bool:
    """spark-submit started this driver: its JVM is already up."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def check_java() -> None:
    if under_spark_submit():
        return
    if find_java() is None:
        where = f"JAVA_HOME={os.environ['JAVA_HOME']} has no bin/java" if os.environ.get("JAVA_HOME") \
            else "no java on PATH and JAVA_HOME is not set"
        raise JavaMissingError(f"Java not found ({where}); Spark needs a Java runtime "
                               f"(17 or 21 for pyspark 4, 8/11/17 for pyspark 3.5)")


def _local_dir() -> str:
    path = os.environ.get("LEDGERMQ_SPARK_LOCAL_DIR") or os.path.join(tempfile.gettempdir(), "ledgermq-spark")
    os.makedirs(path, exist_ok=True)
    return path


# Spark's console logging, quieter than its default profile: errors only,
# and not the executor's copy of a task failure (the job reports that one
# error in one line).  LEDGERMQ_SPARK_LOG_LEVEL=warn/info brings it back.
_LOG4J2 = """status = error
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n
rootLogger.level = {level}
rootLogger.appenderRef.stdout.ref = console
logger.executor.name = org.apache.spark.executor.Executor
logger.executor.level = off
logger.tasks.name = org.apache.spark.scheduler.TaskSetManager
logger.tasks.level = off
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = off
"""


def _log_config(local_dir: str) -> str:
    level = os.environ.get("LEDGERMQ_SPARK_LOG_LEVEL", "error").lower()
    path = os.path.join(local_dir, f"log4j2-{level}.properties")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(_LOG4J2.format(level=level))
        os.replace(tmp, path)
    return path


def driver_log_option() -> str:
    """The driver JVM option that applies our quiet log configuration (for
    spark-submit's --driver-java-options / spark.driver.extraJavaOptions)."""
    return f"-Dlog4j2.configurationFile=file:{_log_config(_local_dir())}"


def build_session(master: str | None = None, conf: dict | None = None, *, app_name: str = "ledgermq-pipeline"):
    """The SparkSession for a job (getOrCreate: an active one is reused)."""
    check_java()
    from pyspark.sql import SparkSession
    conf = dict(conf or {})
    builder = SparkSession.builder.appName(app_name)
    if not under_spark_submit():
        master = master or DEFAULT_MASTER
        builder = builder.master(master)
        merged = {k: v for k, v in DEFAULT_CONF.items() if v is not None}
        merged["spark.local.dir"] = _local_dir()
        merged["spark.driver.extraJavaOptions"] = driver_log_option()
        if master.startswith("local") and "PYSPARK_PYTHON" not in os.environ:
            # Python workers run the driver's interpreter (the venv with
            # ledgermq).  PySpark reads this variable, not spark.pyspark.python,
            # when it starts the context itself.
            os.environ["PYSPARK_PYTHON"] = sys.executable
        merged.update(conf)
    else:
        merged = dict(conf)
    for k, v in merged.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    return spark


def stop_session(spark) -> None:
    """Stop the session and, when this process launched Spark's JVM (not
    under spark-submit), end that JVM too: PySpark keeps it running after
    stop() for a later context.  Only the process PySpark started for us is
    ended, by its own handle; the next session launches a fresh one."""
    from pyspark import SparkContext
    spark.stop()
    if under_spark_submit():
        return
    with SparkContext._lock:
        gateway = SparkContext._gateway
        proc = getattr(gateway, "proc", None) if gateway is not None else None
        if proc is None:
            return
        try:
            gateway.shutdown()
        except Exception:  # noqa: BLE001 - already gone
            pass
        SparkContext._gateway = None
        SparkContext._jvm = None
    try:
        proc.stdin.close() if proc.stdin else None  # the JVM exits when its stdin closes
        proc.wait(timeout=20)
    except Exception:  # noqa: BLE001
        proc.terminate()
        proc.wait(timeout=10)


class Progress:
    """A rich progress display on the driver's stderr: Spark tasks done per
    job (polled from the status tracker) and the driver's own work.  A
    no-op when disabled."""

    def __init__(self, spark, enabled: bool = True):
        self.spark = spark
        self.enabled = enabled
        self._bars = {}
        self._stop = threading.Event()
        self._thread = None
        self._progress = None
        self._current = None  # the Spark stage bar the poller fills
        self._base = 0

    def __enter__(self) -> "Progress":
        if not self.enabled:
            return self
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as RichProgress
        self._progress = RichProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TimeElapsedColumn(), console=Console(stderr=True), transient=False)
        self._progress.start()
        self._thread = threading.Thread(target=self._poll, name="spark-progress", daemon=True)
        self._thread.start()
        return self

    def stage(self, description: str, total: int) -> str:
        """A bar of `total` Spark tasks, filled from the status tracker by
        the jobs that follow (the previous stage's bar is completed)."""
        self._finish_current()
        if self._progress is not None:
            self._bars[description] = self._progress.add_task(description, total=max(total, 1))
            self._base = self._completed_tasks()
            self._current = description
        return description

    def bar(self, description: str, total: int) -> str:
        """A bar the driver advances itself (advance())."""
        self._finish_current()
        if self._progress is not None:
            self._bars[description] = self._progress.add_task(description, total=max(total, 1))
        return description

    def advance(self, description: str, n: int = 1) -> None:
        if self._progress is not None and description in self._bars:
            self._progress.advance(self._bars[description], n)

    def _finish_current(self) -> None:
        cur, self._current = self._current, None
        if self._progress is not None and cur in self._bars:
            task_id = self._bars[cur]
            self._progress.update(task_id, completed=self._progress.tasks[task_id].total)

    def _completed_tasks(self) -> int:
        try:
            tracker = self.spark.sparkContext.statusTracker()
            done = 0
            for job_id in tracker.getJobIdsForGroup():
                job = tracker.getJobInfo(job_id)
                for stage_id in job.stageIds if job else ():
                    info = tracker.getStageInfo(stage_id)
                    if info is not None:
                        done += info.numCompletedTasks
            return done
        except Exception:  # noqa: BLE001 - the display must never break a job
            return 0

    def _poll(self) -> None:
        while not self._stop.wait(0.5):
            cur = self._current
            if cur in self._bars:
                self._progress.update(self._bars[cur], completed=self._completed_tasks() - self._base)

    def __exit__(self, *exc) -> None:
        if self._progress is None:
            return
        self._stop.set()
        self._thread.join(timeout=2)
        if exc[0] is None:
            self._finish_current()
        self._progress.stop()
