# Shim so that `pip install` builds the cffi extension (native/_build.py) in
# out-of-line API mode; all other metadata lives in pyproject.toml.
from setuptools import setup

setup(cffi_modules=["native/_build.py:ffibuilder"])
