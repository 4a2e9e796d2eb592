"""A sweep constraint sees every option with the value the run will use:
an option the point leaves unset is the model's own field (``hidden``),
the ``dp`` that ``tp x pp`` leave, the batch sizes a GPT's step resolves;
None only where the run has no single number (``bucket_mb`` unset)."""
from __future__ import annotations

from distsim.sweep.params import simulate_parameters
from distsim.sweep.spec import SweepSpec
from distsim.sweep.unset import Resolver


def _values(point):
    return Resolver({k: p.default for k, p in simulate_parameters().items()}).values(point)


def test_the_readme_constraint_on_an_unset_hidden_size():
    spec = SweepSpec.create({"model": "gpt3-1.3b", "topology": "dgx-a100"},
                            {"tp": [1, 2, 3]},
                            [{"expr": "hidden % tp == 0", "reason": "tp must divide hidden"}])
    reasons = [p.skip_reason for p in spec.points()]
    assert reasons == [None, None, "tp must divide hidden"]     # 2048 % 3 != 0


def test_unset_options_take_the_values_the_run_uses():
    v = _values({"model": "gpt3-1.3b", "topology": "dgx-a100", "tp": 2, "micro_batch": 2})
    assert (v["hidden"], v["heads"], v["layers"]) == (2048, 16, 24)
    assert (v["dp"], v["pp"], v["devices"]) == (4, 1, 8)
    assert (v["global_batch"], v["batch"], v["micro_batch"]) == (512, 512, 2)
    assert v["microbatches"] == 512 // (4 * 2)
    assert v["virtual_stages"] == 1 and v["zero"] == 0 and v["schedule"] == "1f1b"
    assert v["bucket_mb"] is None


def test_options_the_point_sets_win_and_other_families():
    v = _values({"model": "gpt3-1.3b", "topology": "dgx-a100-x2", "pp": 2,
                 "schedule": "interleaved", "microbatches": 8, "hidden": 1024})
    assert v["hidden"] == 1024 and v["dp"] == 8 and v["micro_batch"] == 512 // (8 * 8)
    assert v["virtual_stages"] == 2
    mlp = _values({"model": "mlp", "dp": 4})
    assert (mlp["hidden"], mlp["batch"], mlp["global_batch"]) == (4096, 2048, 2048)
    assert mlp["heads"] is None


def test_a_point_whose_options_do_not_fit_keeps_what_is_known():
    v = _values({"model": "gpt3-1.3b", "topology": "dgx-a100", "tp": 3})
    assert v["hidden"] == 2048 and v["tp"] == 3 and v["dp"] is None
