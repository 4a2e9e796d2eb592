"""The sharding layer's remembered answers: asked once per key, asked
afresh for a key that does not hash, and the same program whether they are
remembered or not."""
from dataclasses import replace

from distsim.models.gpt import GPTConfig
from distsim.models.gpt_family import build_gpt_step
from distsim.transforms.sharding.remembered import Remembered, forget_all, frozen
from distsim.transforms.strategy import Strategy


def test_an_answer_is_computed_once_per_key_and_afresh_for_an_unhashable_key():
    store: Remembered[int] = Remembered(kept=2)
    calls = []

    def answer(x):
        calls.append(x)
        return x

    assert store.get(("a",), lambda: answer(1)) == 1
    assert store.get(("a",), lambda: answer(2)) == 1
    assert store.get((["unhashable"],), lambda: answer(3)) == 3
    assert store.get((["unhashable"],), lambda: answer(4)) == 4
    assert calls == [1, 3, 4]
    store.get("b", lambda: answer(5))
    store.get("c", lambda: answer(6))       # past kept: forgotten all at once, then kept
    assert "a" not in store.answers and "c" in store
    assert frozen({"shape": [2, [3]], "axis": 1}) == (("axis", 1), ("shape", (2, (3,))))


def _text(f):
    return [(op.op_type, [v.name for v in op.inputs], [(v.name, v.type) for v in op.outputs],
             sorted(op.attrs.items()), sorted((k, repr(x)) for k, x in op.meta.items()))
            for op in f.ops]


def test_a_step_is_the_same_built_with_answers_remembered_or_never_remembered(monkeypatch):
    c = replace(GPTConfig(), layers=3, hidden=32, heads=4, vocab=64, seq=16, ffn=64)
    strategies = (Strategy(dp=1, tp=2), Strategy(dp=1, tp=4, sp=True))
    forget_all()
    remembered = [_text(build_gpt_step(c, s, 1)) for s in strategies]
    monkeypatch.setattr(Remembered, "get", lambda self, key, compute: compute())
    asked = [_text(build_gpt_step(c, s, 1)) for s in strategies]
    assert remembered == asked
