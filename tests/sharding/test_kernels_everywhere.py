"""A lowered program read back from text runs in the numpy executor
whatever was imported first: the interp package registers the kernels of
every op kind the ir defines (shard_slice, redistribute included), not the
sharding package that emits them."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# piece 1 of 2 along dim 0: what a device keeps of a replicated value
LOWERED = '''func @main(%x_r0: f32[4,3]@0, %x_r1: f32[4,3]@1) -> (f32[2,3]@0, f32[2,3]@1) {
  %y_r0 = shard_slice(%x_r0) {dim = 0, index = 0, parts = 2} : f32[2,3]@0
  %y_r1 = shard_slice(%x_r1) {dim = 0, index = 1, parts = 2} : f32[2,3]@1
  return %y_r0, %y_r1
}
'''

RUN = f'''
import sys
import numpy as np
from distsim.interp import execute
from distsim.text import parse_function
f = parse_function({LOWERED!r})
x = np.arange(12, dtype=np.float32).reshape(4, 3)
y0, y1 = execute(f, [x, x])
assert (y0 == x[:2]).all() and (y1 == x[2:]).all()
print("sharding loaded:", "distsim.transforms.sharding" in sys.modules)
'''

EVERY_OP = '''
from distsim.interp import KERNELS
from distsim.ir import all_op_types, lookup
from distsim.ir.ops_call import CALL
from distsim.ir.ops_fused import FUSED
missing = [t for t in all_op_types() if t not in KERNELS and not lookup(t).is_communication
           and t not in (CALL, FUSED)]
print(missing)
'''


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_lowered_program_from_text_runs_without_the_sharding_package():
    assert _run(RUN) == "sharding loaded: False"


def test_every_op_kind_the_ir_defines_has_a_kernel():
    # collectives run as collectives, call and fused run their function
    assert _run(EVERY_OP) == "[]"
