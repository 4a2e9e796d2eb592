"""Sharded tensors on N-D device meshes: annotation, propagation (through
calls), the redistribution planner, lowering to the local view, rewrites
on communication ops, and the verifier. See the README section "Sharded
tensors on device meshes".

    module = parse_module(text)           # meshes, DTensor annotations, calls
    sharded = propagate(module)           # every value placed, callees specialised
    local = lower(sharded)                # per-device ops + comm.* ops
    local = simplify_comms(local)
"""
from .annotate import annotate_sharding, placements_of
from .arrays import assemble, distribute, local_inputs
from .check import CheckResult, check_lowering
from .lower import LOCAL_RULES, lower
from .planner import Step, plan_redistribute, step_bytes
from .propagate import propagate
from .rewrites import simplify_comms
from .rules import RULES, strategies_for
from . import rules_cnn as _rules_cnn  # noqa: F401,E402  (registers the CNN and backward rules)
from . import rules_context as _rules_context  # noqa: F401,E402  (context-parallel collectives)
from . import rules_moe as _rules_moe  # noqa: F401,E402  (mixture-of-experts routing)
from .verify import verify_sharded, verify_teams


def shard_program(module, entry: str = "main"):
    """propagate, verify, lower and simplify: (sharded module, local function)."""
    sharded = verify_sharded(propagate(module, entry), propagated=True)
    local = simplify_comms(lower(sharded, entry))
    verify_teams(local, sharded.meshes)
    return sharded, local


__all__ = ["annotate_sharding", "placements_of", "assemble", "distribute", "local_inputs",
           "CheckResult", "check_lowering", "LOCAL_RULES", "lower", "Step", "plan_redistribute",
           "step_bytes", "propagate", "simplify_comms", "RULES", "strategies_for",
           "verify_sharded", "verify_teams", "shard_program"]
