# Owns crash-safe file replacement, the one write-temp-fsync-rename every
# layer uses for its small state files (currterm, checkpoints, markers,
# dispatch state, the metadata snapshot): a crash leaves the old file or the
# new one, never a torn mix, and a rename is durable only once its
# directory was fsync'ed too.
import os


def fsync_dir(path: str) -> None:
    """Make a create/rename/unlink inside `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_tmp(path: str, data: bytes) -> str:
    """Write and fsync `path`.tmp; returns its name (the caller renames it,
    so that several files can be renamed before one directory fsync)."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        # A full disk (ENOSPC) must not leave a partial temp file holding
        # the space it could not finish using; the old file stays.
        os.close(fd)
        fd = -1
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    finally:
        if fd >= 0:
            os.close(fd)
    return tmp


def write_atomic(path: str, data: bytes) -> None:
    """Replace `path` with `data` so a crash leaves the old or the new file."""
    os.replace(write_tmp(path, data), path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))
