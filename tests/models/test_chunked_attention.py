"""Attention over chunks of a sequence (context parallelism's ``q_chunks``
and ``k_chunks``): the kernels give the rows of the whole causal attention,
their gradients match finite differences, the FLOPs count the visible
pairs by hand, and bad chunk attributes are one error naming them."""
from __future__ import annotations

import numpy as np
import pytest

from distsim.cost.flops import op_flops
from distsim.interp import execute
from distsim.interp.gradcheck import finite_difference
from distsim.interp.kernels import KERNELS
from distsim.ir import DType, FunctionBuilder, TensorType, verify
from distsim.errors import VerifyError
from distsim.transforms.autodiff import Autodiff
from distsim.transforms.context_parallel import balanced_chunks, gathered_chunks, local_sequence

F64 = DType.F64


def t(*shape):
    return TensorType(shape, F64, 0)


def _rows(cp, rank, seq):
    """Global positions of ``rank``'s queries (its two chunks)."""
    size = seq // (2 * cp)
    return np.concatenate([c * size + np.arange(size) for c in balanced_chunks(rank, cp)])


@pytest.mark.parametrize("cp", [2, 3])
def test_fused_kernel_on_a_ranks_chunks_gives_the_rows_of_the_whole_attention(cp):
    rng = np.random.default_rng(0)
    seq = 4 * cp
    q = rng.normal(size=(2, 2, 3, seq, 4))
    k = rng.normal(size=(2, 2, 1, seq, 4))
    v = rng.normal(size=(2, 2, 1, seq, 5))
    whole, whole_lse = KERNELS["fused_attention"]({"scale": 0.4}, q, k, v)
    # the keys as the all-gather lays them out: every rank's chunks in rank order
    gathered = np.concatenate([local_sequence(k, r, cp, axis=3) for r in range(cp)], axis=3)
    gathered_v = np.concatenate([local_sequence(v, r, cp, axis=3) for r in range(cp)], axis=3)
    for r in range(cp):
        attrs = {"scale": 0.4, "q_chunks": balanced_chunks(r, cp),
                 "k_chunks": gathered_chunks(cp)}
        out, lse = KERNELS["fused_attention"](attrs, local_sequence(q, r, cp, axis=3),
                                              gathered, gathered_v)
        rows = _rows(cp, r, seq)
        np.testing.assert_allclose(out, whole[..., rows, :], rtol=1e-12)
        np.testing.assert_allclose(lse, whole_lse[..., rows], rtol=1e-12)


def test_causal_mask_on_chunks_hides_the_later_positions():
    x = np.zeros((4, 8))
    attrs = {"fill": -1.0, "q_chunks": (0, 3), "k_chunks": (0, 3, 1, 2)}
    got = KERNELS["causal_mask"](attrs, x)
    # query rows: positions 0, 1 (chunk 0) and 6, 7 (chunk 3); keys 0 1 6 7 2 3 4 5
    keys = np.array([0, 1, 6, 7, 2, 3, 4, 5])
    for i, pos in enumerate([0, 1, 6, 7]):
        np.testing.assert_array_equal(got[i], np.where(keys > pos, -1.0, 0.0))


def _chunked_loss(fused: bool):
    b = FunctionBuilder("f")
    q, k, v = b.input("q", t(1, 2, 4, 3)), b.input("k", t(1, 2, 8, 3)), b.input("v", t(1, 2, 8, 3))
    chunks = {"q_chunks": [1, 2], "k_chunks": [0, 3, 1, 2]}
    if fused:
        out, _ = b.op("fused_attention", [q, k, v], {"scale": 0.7, **chunks})
    else:
        s = b.op("matmul", [q, k], {"trans_b": True})
        s = b.op("causal_mask", [b.op("scale", [s], {"factor": 0.7})], chunks)
        out = b.op("matmul", [b.op("softmax", [s], {"axis": -1}), v])
    w = b.input("w", out.type)
    loss = b.op("reduce_sum", [b.op("mul", [out, w])])
    return verify(b.finish([b.op("identity", [loss], name="loss")]))


@pytest.mark.parametrize("fused", [True, False])
def test_gradients_on_chunks_match_finite_differences(fused):
    f = _chunked_loss(fused)
    rng = np.random.default_rng(3)
    inputs = [rng.uniform(-1, 1, v.type.shape) for v in f.inputs]
    g = verify(Autodiff("loss", ["q", "k", "v"])(f))
    results = execute(g, inputs)
    for i, name in enumerate(["q", "k", "v"]):
        np.testing.assert_allclose(results[1 + i], finite_difference(f, inputs, i),
                                   rtol=1e-6, atol=1e-9, err_msg=name)


@pytest.mark.parametrize("rank", [0, 1])
def test_flops_count_the_visible_chunk_pairs_by_hand(rank):
    # cp 2: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2, against the
    # gathered keys 0 3 1 2. Rank 0: chunk 0 sees half of key chunk 0;
    # chunk 3 sees 0, 1, 2 whole and half of 3: 0.5 + 3.5 = 4 of 8 chunk
    # pairs. Rank 1: chunk 1 sees 0 and half of 1 (1.5), chunk 2 sees 0, 1
    # and half of 2 (2.5): 4 of 8 too -- balanced.
    b = FunctionBuilder("f")
    q, k = b.input("q", t(2, 3, 8, 16)), b.input("k", t(2, 3, 16, 16))
    b.op("fused_attention", [q, k, k], {"q_chunks": list(balanced_chunks(rank, 2)),
                                        "k_chunks": list(gathered_chunks(2))})
    op = b.function.ops[0]
    pairs = 2 * 3 * 8 * 16 * (4 / 8)
    assert op_flops(op) == pytest.approx(2 * pairs * (16 + 16))


@pytest.mark.parametrize("attrs, message", [
    ({"q_chunks": [0, 3]}, "given together"),
    ({"q_chunks": [0, 3, 1], "k_chunks": [0, 3, 1, 2]}, "do not divide"),
    ({"q_chunks": [0, 3], "k_chunks": [0, 3]}, "differ in size"),
    ({"q_chunks": [0, -3], "k_chunks": [0, 3, 1, 2]}, "non-negative"),
    ({"q_chunks": [0, 3], "k_chunks": [0, 3, 1, 2], "causal": False}, "causal true"),
])
def test_bad_chunks_are_one_error_naming_them(attrs, message):
    b = FunctionBuilder("f")
    q, k = b.input("q", t(1, 4, 2)), b.input("k", t(1, 8, 2))
    with pytest.raises(VerifyError, match=message):
        b.op("fused_attention", [q, k, k], attrs)


def test_rows_that_see_no_key_give_zero_and_minus_infinity():
    """A ring step's block after some queries: those rows see no key (out 0,
    lse -inf, which the merge of the blocks ignores); the backward gives
    them no gradient and stays finite."""
    rng = np.random.default_rng(4)
    q, k, v = rng.normal(size=(1, 4, 3)), rng.normal(size=(1, 4, 3)), rng.normal(size=(1, 4, 3))
    attrs = {"scale": 0.5, "q_chunks": (0, 3), "k_chunks": (1, 2)}
    out, lse = KERNELS["fused_attention"](attrs, q, k, v)
    assert np.all(out[:, :2] == 0) and np.all(np.isneginf(lse[:, :2]))
    assert np.all(np.isfinite(out[:, 2:])) and np.all(np.isfinite(lse[:, 2:]))
    dout = rng.normal(size=out.shape)
    grads = KERNELS["fused_attention_grad"](attrs, dout, q, k, v, out, lse)
    assert all(np.all(np.isfinite(g)) for g in grads)
    assert np.all(grads[0][:, :2] == 0)
