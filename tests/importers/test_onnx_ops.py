"""Each op of the importer's table on its own: NumpyExecutor on the
imported function equals onnx.reference.ReferenceEvaluator on the model
(float32; rtol 1e-5, atol 1e-6)."""
import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

from distsim.importers.onnx import import_onnx, onnx_input_arrays
from distsim.importers.onnx_ops import CONVERTERS, FOLD_ONLY
from distsim.interp import execute

from onnx_cases import CASES, random_feeds

RTOL, ATOL = 1e-5, 1e-6


def compare(model, seed=0):
    feeds = random_feeds(model, seed)
    f = import_onnx(model)
    ours = execute(f, onnx_input_arrays(f, feeds))
    theirs = ReferenceEvaluator(model).run(None, feeds)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        b = np.asarray(b)
        assert a.shape == b.shape
        assert a.dtype == b.dtype or (a.dtype.kind == b.dtype.kind == "f")
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=RTOL, atol=ATOL)
    return f


def test_every_converter_has_a_case():
    """Fold-only ops (Range, CumSum, ...) run in onnx.reference itself at import time."""
    assert sorted(set(CONVERTERS) - set(CASES) - set(FOLD_ONLY)) == []


@pytest.mark.parametrize("op_type", sorted(CASES))
def test_op_matches_reference(op_type):
    compare(CASES[op_type])
