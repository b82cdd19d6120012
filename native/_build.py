# Owns the cffi build of ledgermq's C helpers (out-of-line API mode).
#
# Every native/src/<part>.c is compiled into the single extension module
# `native._native`; its declarations for Python live next to it in
# native/src/<part>.cdef (plain C prototypes, no preprocessor lines).  Adding
# a C helper therefore never requires editing this file, so several parts of
# the tree can grow native code independently.
import glob
import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "src")

ffibuilder = FFI()

_cdefs = sorted(glob.glob(os.path.join(SRC, "*.cdef")))
_sources = sorted(glob.glob(os.path.join(SRC, "*.c")))
_headers = sorted(glob.glob(os.path.join(SRC, "*.h")))

ffibuilder.cdef("\n".join(open(p, encoding="utf-8").read() for p in _cdefs))
ffibuilder.set_source(
    "native._native",
    "\n".join(f'#include "{os.path.basename(h)}"' for h in _headers),
    # Relative paths keep setuptools happy (it rejects absolute sources).
    sources=[os.path.relpath(p, os.getcwd()) for p in _sources],
    include_dirs=[SRC],
    extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
)

if __name__ == "__main__":
    # `make native`: build in place next to the sources (native/_native*.so).
    # The module is built under a scratch name and renamed over the old one,
    # so a process starting meanwhile loads either build, never half of one.
    # Builds with other ABI tags are removed, or Python may import a stale one.
    import sysconfig

    os.chdir(os.path.dirname(HERE))
    target = os.path.join(HERE, "_native" + sysconfig.get_config_var("EXT_SUFFIX"))
    scratch = ffibuilder.compile(target=os.path.join("native", "_native.building.so"), verbose=False)
    os.replace(scratch, target)
    try:  # setuptools leaves an empty package directory behind for a named target
        os.rmdir(os.path.join(HERE, "native"))
    except OSError:
        pass
    for stale in glob.glob(os.path.join(HERE, "_native*.so")):
        if stale != target:
            os.remove(stale)
