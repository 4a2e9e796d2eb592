"""tests/strategies/conftest.py's ``Reference`` (the single-device step every
strategy is checked against) for the model tests, loaded by path: that
folder is not a package."""
import importlib.util
from pathlib import Path


def strategies_reference():
    path = Path(__file__).resolve().parents[1] / "strategies" / "conftest.py"
    spec = importlib.util.spec_from_file_location("strategies_conftest", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Reference
