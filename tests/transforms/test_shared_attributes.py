"""Builders emitting ops by the million share one attribute dict among the
copies of an op (Op.trusted): the dicts must stay what each op's
attributes are, equal to an unshared build and never changed in place."""
from collections import defaultdict

import pytest

from distsim.api import build_program
from distsim.text import parse_module, print_program


@pytest.fixture(scope="module")
def fused():
    program, _, _ = build_program("tiny", "dgx-a100", dp=2, tp=2, pp=2, coarsen=True,
                                  microbatches=4, verify_program=True)
    return program


def test_copies_of_a_segment_share_one_attribute_dict(fused):
    by_segment = defaultdict(set)
    for op in fused.ops:
        # a fused kernel (--fusion) left alone between communications is an
        # op of the step, emitted as the others (its dicts: below)
        if op.op_type == "fused" and not op.attrs.get("kernel"):
            by_segment[op.attrs["segment"]].add(id(op.attrs))
            # ops: the run's ops, not the pack and unpack of its bundles
            run = [o for o in op.subfunctions[0].ops if o.op_type not in ("pack", "unpack")]
            assert op.attrs == {"segment": op.subfunctions[0].name, "ops": len(run)}
    assert by_segment
    # every segment runs once per micro-batch (4 here) and rank, one dict
    assert all(len(ids) == 1 for ids in by_segment.values())
    copies = [op for op in fused.ops if op.op_type == "fused" and not op.attrs.get("kernel")]
    assert len(copies) > len(by_segment)


def test_repeated_ops_share_the_memo_attribute_dict(fused):
    """Collectives (and other ops the emitter memoizes) repeat per
    micro-batch with one attribute dict; each dict still holds only what
    its ops' attributes are."""
    by_dict = defaultdict(list)
    for op in fused.ops:
        by_dict[id(op.attrs)].append(op)
    shared = [ops for ops in by_dict.values() if len(ops) > 1]
    assert any(op.op_type.startswith("comm.") for ops in shared for op in ops)
    for ops in shared:
        assert len({op.op_type for op in ops}) == 1


def test_meta_stays_one_dict_per_op(fused):
    """meta is changed by analyses (stage ids, costs): never shared."""
    assert len({id(op.meta) for op in fused.ops}) == len(fused.ops)


def test_shared_attributes_print_and_parse_back(fused):
    text = print_program(fused)       # the step, then its fused segments
    again = parse_module(text).main
    assert print_program(again) == text
    # parsed ops get dicts of their own; the attributes are equal
    assert [op.attrs for op in again.ops] == [op.attrs for op in fused.ops]
