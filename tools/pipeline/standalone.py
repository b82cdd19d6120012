# Owns a Spark standalone cluster on this machine: one master and N workers
# started as separate JVMs from the PySpark installation (`spark-class
# org.apache.spark.deploy.master.Master` / `...worker.Worker`), all bound to
# 127.0.0.1, each worker with its own work dir, cores and memory, and
# `spark-submit --master spark://127.0.0.1:PORT` against it.  The tests and
# the pipeline benchmark use it; an operator's real cluster is started by
# Spark's own scripts instead.
#
# Every process is ours by PID: spark-class execs the JVM, so the PID we
# started is the JVM's.  stop() ends the workers first (a worker kills its
# executors on shutdown), then any executor JVM still alive that a worker
# had started (found by parent PID before the worker went), then the master:
# SIGTERM, then SIGKILL after a grace period.
#
# The daemons get a cleaned environment: no PYTHONPATH or PYSPARK_* of the
# caller, so executors import ledgermq only from what the job ships (the
# packed environment, packenv.py), never from the caller's checkout.
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import attrs

from tools.localcluster import free_ports

DROP_ENV = ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYSPARK_GATEWAY_PORT",
            "PYSPARK_GATEWAY_SECRET", "SPARK_CONF_DIR", "LEDGERMQ_NO_NATIVE")


class ClusterError(RuntimeError):
    """The standalone cluster did not come up (names the log to read)."""


def spark_home() -> str:
    import pyspark
    return os.path.dirname(os.path.abspath(pyspark.__file__))


def free_port() -> int:
    return free_ports(1)[0]  # (below the ephemeral range: see free_ports)


def daemon_env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in DROP_ENV}
    env.update(SPARK_HOME=spark_home(), SPARK_LOCAL_IP="127.0.0.1", SPARK_MASTER_HOST="127.0.0.1")
    env.update(extra or {})
    return env


def _children(pid: int) -> list[int]:
    """PIDs whose parent is `pid` (from /proc; empty elsewhere)."""
    out = []
    try:
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/stat") as f:
                        stat = f.read()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(name))
    except OSError:
        pass
    return out


def _alive(pid: int) -> bool:
    """Running (an exited child not yet reaped, a zombie, is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _end_all(pids: list[int], grace: float) -> None:
    """SIGTERM to each PID (ours), wait up to `grace` for all, then SIGKILL
    the ones still alive."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.1)
        pids = [p for p in pids if _alive(p)]
        if not pids:
            return


@attrs.define
class StandaloneCluster:
    """A master and `workers` workers under `base` (logs, work dirs)."""

    base: str
    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    port: int = 0
    web_port: int = 0
    procs: list = attrs.field(factory=list)  # (name, Popen, log file)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def work_dir(self, k: int) -> str:
        return os.path.join(self.base, f"worker-{k}", "work")

    def _start(self, name: str, args: list, env: dict) -> None:
        log = open(os.path.join(self.base, f"{name}.log"), "wb")
        p = subprocess.Popen([os.path.join(spark_home(), "bin", "spark-class"), *args], env=env,
                             stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.procs.append((name, p, log))

    def start(self, timeout: float = 90.0) -> "StandaloneCluster":
        os.makedirs(self.base, exist_ok=True)
        self.port, self.web_port = free_port(), free_port()
        # The daemons only schedule: C1 is enough and starts them faster.
        opts = "-XX:TieredStopAtLevel=1 -Dspark.worker.cleanup.enabled=false"
        try:
            self._start("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
                                   str(self.port), "--webui-port", str(self.web_port)],
                        daemon_env({"SPARK_DAEMON_JAVA_OPTS": opts, "SPARK_DAEMON_MEMORY": "512m"}))
            for k in range(self.workers):
                work = self.work_dir(k)
                os.makedirs(work, exist_ok=True)
                local = os.path.join(self.base, f"worker-{k}", "local")
                os.makedirs(local, exist_ok=True)
                self._start(f"worker-{k}", ["org.apache.spark.deploy.worker.Worker", self.url, "--host",
                                            "127.0.0.1", "--port", str(free_port()), "--webui-port",
                                            str(free_port()), "--cores", str(self.cores), "--memory", self.memory,
                                            "--work-dir", work],
                            daemon_env({"SPARK_DAEMON_JAVA_OPTS": opts, "SPARK_DAEMON_MEMORY": "512m",
                                        "SPARK_LOCAL_DIRS": local}))
            self.wait_workers(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def state(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.web_port}/json/", timeout=5) as r:
            return json.load(r)

    def wait_workers(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        alive = 0
        while time.monotonic() < deadline:
            for name, p, _ in self.procs:
                if p.poll() is not None:
                    raise ClusterError(f"{name} exited with {p.returncode}; see {self.base}/{name}.log")
            try:
                alive = sum(1 for w in self.state().get("workers", []) if w.get("state") == "ALIVE")
            except OSError:
                alive = 0
            if alive >= self.workers:
                return
            time.sleep(0.5)
        raise ClusterError(f"{alive} of {self.workers} workers registered within {timeout:.0f} s; "
                           f"see the logs in {self.base}")

    def submit(self, script: str, args: list, *, conf: dict, env: dict | None = None, jvm_opts: str = "",
               timeout: float = 300.0) -> subprocess.CompletedProcess:
        """spark-submit `script args` in client mode; the driver runs this
        interpreter (it has PySpark), executors whatever conf says.
        `jvm_opts` go to the driver's and the executors' JVMs (the tests pass
        -XX:TieredStopAtLevel=1: their jobs are too short for C2 to pay)."""
        from tools.pipeline.sparkenv import driver_log_option
        cmd = [os.path.join(spark_home(), "bin", "spark-submit"), "--master", self.url,
               "--conf", f"spark.pyspark.driver.python={sys.executable}", "--conf", "spark.driver.host=127.0.0.1",
               "--conf", "spark.driver.bindAddress=127.0.0.1",
               "--conf", f"spark.driver.extraJavaOptions={driver_log_option()} {jvm_opts}".rstrip()]
        if jvm_opts:
            cmd += ["--conf", f"spark.executor.extraJavaOptions={jvm_opts}"]
        for k, v in conf.items():
            cmd += ["--conf", f"{k}={v}"]
        return subprocess.run(cmd + [script, *args], capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", **(env or {})),
                              stdin=subprocess.DEVNULL)

    def stop(self, grace: float = 8.0) -> None:
        """Workers first, all at once (each kills its executors on SIGTERM),
        then executors a worker left behind, then the master."""
        workers = [p for n, p, _ in self.procs if n.startswith("worker")]
        executors = [c for p in workers for c in _children(p.pid)]
        _end_all([p.pid for p in workers], grace)
        _end_all([pid for pid in executors if _alive(pid)], grace)
        _end_all([p.pid for n, p, _ in self.procs if n == "master"], grace)
        for _, p, log in self.procs:
            p.wait()
            log.close()
        self.procs.clear()

    def __enter__(self) -> "StandaloneCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
