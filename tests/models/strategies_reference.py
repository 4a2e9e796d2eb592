"""tests/strategies/gpt_reference.py's ``Reference`` (the single-device step
every strategy is checked against) for the model tests, loaded by path:
that folder is not a package, and it is on ``sys.path`` only when pytest
collects it (so running a model test file alone must not depend on it)."""
import importlib.util
from pathlib import Path


def strategies_reference():
    path = Path(__file__).resolve().parents[1] / "strategies" / "gpt_reference.py"
    spec = importlib.util.spec_from_file_location("strategies_gpt_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Reference
