"""Pipeline transfers under the flow network (:mod:`distsim.estimate.shared_links`):
only transfers whose routes share a link are timed together. (Where they
do, the agreement corpus's flow seeds compare the estimate with the
simulation.)"""
from __future__ import annotations

from distsim.estimate import estimate

#: two servers, one pipeline stage on each: a stage's transfers all go to
#: the other stage, the forward outputs one way and the input gradients
#: the other, on links of their own (each direction of a link is its own)
TWO_STAGES = {"model": "gpt3-1.3b", "layers": 4, "seq": 1024, "topology": "dgx-a100-x2",
              "tp": 8, "pp": 2, "dp": 1, "micro_batch": 1, "global_batch": 16,
              "schedule": "interleaved", "virtual_stages": 2, "recompute": "full",
              "comm_order": "stream"}


def test_the_two_ways_of_one_pair_of_stages_share_nothing():
    flow = estimate(dict(TWO_STAGES, network_mode="flow"))
    analytical = estimate(dict(TWO_STAGES, network_mode="analytical"))
    assert flow == analytical


def test_the_flow_network_is_the_default():
    """As :func:`distsim.simulate`'s: no ``network_mode`` estimates under
    flow, where six stages of a long interleaved pipeline send to both
    neighbours at once through each rank's one NIC (a corpus seed's
    configuration): slower than each transfer alone."""
    model = {"name": "gpt-1024-24", "family": "gpt", "layers": 24, "hidden": 1024,
             "heads": 16, "vocab": 51200, "seq": 2048, "dtype": "fp16"}
    options = dict(TWO_STAGES, model=model, topology="dgx-a100-x6", pp=6, global_batch=24,
                   virtual_stages=4)
    del options["layers"], options["seq"]
    default = estimate(options)
    assert default == estimate(dict(options, network_mode="flow"))
    alone = estimate(dict(options, network_mode="analytical"))
    assert default["step_time_s"] > alone["step_time_s"] * 1.02
