"""Shared by every test directory: the contracts that more than one implementation passes."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "contracts"))
