"""A machine without torch, as `make synth` sets one up: Python's site module imports this at start-up when this
folder is on PYTHONPATH (tests/conftest.py without_torch), and from then on importing torch, or anything under it,
raises ModuleNotFoundError ("import of torch halted; None in sys.modules").
"""

import sys

sys.modules["torch"] = None
