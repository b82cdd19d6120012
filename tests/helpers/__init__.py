# Owns what the test packages share beyond one package: the repository root
# (tests start processes and tools from it) and, in the modules beside this
# one, fixtures built with the project's own codecs and the one way to wait
# for a condition (waiting.py).
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
