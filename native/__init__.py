# Owns loading of the compiled C helpers (native._native, built by
# native/_build.py) and the switch to the pure-Python fallbacks.
#
# Every hot helper has a twin in Python with the same API; the Python twin is
# the test oracle and what runs when the extension is missing or when
# LEDGERMQ_NO_NATIVE=1.  Callers import the helper from its module (e.g.
# native.hashing.crc32) and never look at `lib` directly.
import os

ffi = None
lib = None
LOAD_ERROR: str | None = None

if os.environ.get("LEDGERMQ_NO_NATIVE") == "1":
    LOAD_ERROR = "disabled by LEDGERMQ_NO_NATIVE=1"
else:
    try:
        from native._native import ffi, lib  # type: ignore[no-redef]
    except ImportError as exc:  # not built: fall back, and say why
        LOAD_ERROR = f"native extension not built ({exc}); run `make native`"

NATIVE_LOADED = lib is not None
