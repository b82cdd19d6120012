# Owns the packed virtual environment that ships ledgermq to Spark executors
# (`spark-submit --archives ledgermq-env.tar.gz#env --conf
# spark.pyspark.python=./env/bin/python`): PySpark's own way to ship Python
# code with native parts, since --py-files zips cannot carry the compiled
# cffi module (native._native).
#
# Built from a source tree, never from the running venv (an editable install
# points at a checkout and venv-pack refuses it):
#   1. `pip wheel --no-deps --no-build-isolation` of the tree (the C helpers
#      compiled by setup.py; build tools come from the running venv, so
#      nothing but PyPI is ever reached, and only for runtime dependencies);
#   2. a fresh venv (same interpreter) with that wheel and its runtime
#      dependencies installed by the running venv's pip;
#   3. venv-pack of that venv into one tar.gz.
# The archive is cached under <tree>/.venv-spark-pack/ by a content hash of
# everything that goes into the wheel and of the interpreter, so a test
# session or a benchmark packs once (~30-60 s) and reuses it afterwards.
# PySpark itself is not in the archive: executors import it from their
# worker's Spark installation, as always.
#
#   python -m tools.pipeline.packenv [--tree DIR]   # prints the archive path
import fcntl
import glob
import hashlib
import os
import platform
import shutil
import subprocess
import sys

import click

from tools.cli import CONTEXT, run_command

PACK_DIR = ".venv-spark-pack"
ARCHIVE_PREFIX = "ledgermq-env-"
PACKAGES = ("broker", "commitlog", "consumequeue", "native", "tools")
TOP_FILES = ("pyproject.toml", "setup.py")
KEEP = 2  # archives of older trees kept beside the current one


class PackError(RuntimeError):
    """The packed environment could not be built (names the failing step)."""


def default_tree() -> str:
    """The source tree this module was imported from."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def content_hash(tree: str) -> str:
    """sha256 over the files that make the wheel (package sources, native
    C sources, build metadata) and the interpreter's version and platform."""
    h = hashlib.sha256()
    h.update(f"{sys.version_info[:3]} {platform.machine()} {sys.platform}\n".encode())
    files = [os.path.join(tree, f) for f in TOP_FILES]
    for pkg in PACKAGES:
        for d, dirs, names in os.walk(os.path.join(tree, pkg)):
            dirs[:] = sorted(x for x in dirs if x != "__pycache__")
            files += [os.path.join(d, n) for n in sorted(names) if n.endswith((".py", ".c", ".h"))]
    for path in files:
        h.update(os.path.relpath(path, tree).encode() + b"\0")
        with open(path, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()[:20]


def _run(step: str, cmd: list, log, cwd: str) -> None:
    log(f"  packenv: {step}")
    # Never in the tree: pip would take its in-tree build's egg-info for an
    # installed ledgermq and skip the wheel.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=cwd, env=env)
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-5:]
        raise PackError(f"{step} failed ({' '.join(cmd[:4])} ...): " + " | ".join(tail))


def _build(tree: str, work: str, archive: str, log) -> None:
    import venv_pack
    os.makedirs(work)
    wheels, env = os.path.join(work, "wheels"), os.path.join(work, "env")
    _run("wheel", [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                   "-w", wheels, tree], log, work)
    (wheel,) = glob.glob(os.path.join(wheels, "ledgermq-*.whl"))
    _run("venv", [sys.executable, "-m", "venv", "--without-pip", env], log, work)
    _run("install", [sys.executable, "-m", "pip", "--python", os.path.join(env, "bin", "python"), "install",
                     "-q", "--no-warn-script-location", wheel], log, work)
    _run("check", [os.path.join(env, "bin", "python"), "-I", "-c",
                   "import tools.pipeline.segscan; from native import dispatch; "
                   "assert dispatch.NATIVE is not None, 'no native module'"], log, work)
    log("  packenv: venv-pack")
    venv_pack.pack(prefix=env, output=archive + ".tmp", format="tar.gz", force=True, compress_level=1)
    os.chmod(archive + ".tmp", 0o644)  # workers may run as another user
    os.replace(archive + ".tmp", archive)


def packed_env(tree: str | None = None, log=lambda *a: None) -> str:
    """The path of the packed environment of `tree` (built unless cached)."""
    tree = os.path.abspath(tree or default_tree())
    base = os.path.join(tree, PACK_DIR)
    os.makedirs(base, exist_ok=True)
    archive = os.path.join(base, f"{ARCHIVE_PREFIX}{content_hash(tree)}.tar.gz")
    with open(os.path.join(base, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time; the others wait and reuse it
        if os.path.exists(archive):
            return archive
        work = os.path.join(base, f"build-{os.getpid()}")
        shutil.rmtree(work, ignore_errors=True)
        try:
            _build(tree, work, archive, log)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        old = sorted(glob.glob(os.path.join(base, ARCHIVE_PREFIX + "*.tar.gz")), key=os.path.getmtime)
        for path in [p for p in old if p != archive][:-KEEP or None]:
            os.unlink(path)
    return archive


def submit_conf(archive: str, alias: str = "env") -> dict:
    """The Spark settings that ship `archive` and run executors' Python in it."""
    return {"spark.archives": f"{archive}#{alias}", "spark.pyspark.python": f"./{alias}/bin/python"}


@click.command(context_settings=CONTEXT)
@click.option("--tree", type=click.Path(file_okay=False), help="the ledgermq source tree (default: this one)")
def command(tree: str | None) -> int:
    """Build (or find cached) the packed ledgermq environment for Spark
    executors and print its path."""
    try:
        print(packed_env(tree, log=lambda m: print(m, file=sys.stderr)))
    except (PackError, OSError, ImportError) as exc:
        print(f"packenv: error: {exc}", file=sys.stderr)
        return 3
    return 0


def main(argv=None) -> int:
    return run_command(command, argv, "python -m tools.pipeline.packenv")


if __name__ == "__main__":
    sys.exit(main())
