"""The estimator's timeline under stream order (``comm_order: stream``):
a communication item starts no earlier than the end of the compute its
stages issued before it, whatever its inputs. Times by hand."""
import distsim
import pytest
from distsim.estimate import AGREEMENT_TOLERANCE, estimate
from distsim.estimate.engine import Timeline


def test_a_collective_waits_for_the_compute_issued_before_it():
    for stream_order, start in ((False, 1.0), (True, 3.0)):
        tl = Timeline(1, stream_order=stream_order)
        tl.compute(0, 1.0)                  # makes the gradient: 0-1
        tl.compute(0, 2.0, 1.0)             # unrelated compute: 1-3
        # the gradient's all-reduce, ready at 1: at 1 by its input, at 3 behind the compute
        assert tl.comm_on(0, 4.0, 1.0) == start + 4.0
        # compute after it waits only for what it reads
        assert tl.compute(0, 1.0, 0.0) == 4.0


def test_a_collective_over_stages_waits_for_each_stages_compute():
    tl = Timeline(2, stream_order=True)
    tl.compute(0, 1.0)                      # 0-1
    tl.compute(1, 5.0)                      # 0-5
    assert tl.comm((0, 1), 2.0, 1.0) == 7.0     # 5-7: stage 1's compute ends last
    tl = Timeline(2, per_group=True, stream_order=True)   # the tied embedding's stream
    tl.compute(0, 1.0)
    tl.compute(1, 5.0)
    assert tl.comm((0, 1), 2.0, 1.0) == 7.0


def test_a_transfer_waits_for_the_compute_of_both_its_stages():
    tl = Timeline(2, stream_order=True)
    tl.compute(0, 2.0)                      # the sender's output: 0-2
    tl.compute(1, 3.0)                      # the receiver's compute issued before the receive: 0-3
    # two sends of one task, each 1: 3-4, 4-5 (without stream order 2-3, 3-4)
    assert tl.p2p_chain(0, 1, [1.0, 1.0], 2.0, 0.0) == 5.0
    tl = Timeline(2)
    tl.compute(0, 2.0)
    tl.compute(1, 3.0)
    assert tl.p2p_chain(0, 1, [1.0, 1.0], 2.0, 0.0) == 4.0


def test_the_two_ways_of_an_exchange_move_at_once():
    # stage 0's forward 0-1, stage 1's backward 0-2; then the activation
    # 0 -> 1 (1) and the gradient 1 -> 0 (1), each on its direction's queue:
    # both 2-3 (one queue for the pair: the gradient 3-4)
    tl = Timeline(2, stream_order=True)
    tl.compute(0, 1.0)
    tl.compute(1, 2.0)
    assert tl.p2p_chain(0, 1, [1.0], 1.0, 0.0) == 3.0
    assert tl.p2p_chain(1, 0, [1.0], 2.0, 0.0) == 3.0
    # a second transfer the same way waits for the first: 3-4
    assert tl.p2p_chain(0, 1, [1.0], 1.0, 0.0) == 4.0


def test_the_optimizer_chain_all_gathers_after_the_updates_issued_before():
    for per_group in (False, True):
        tl = Timeline(1, per_group=per_group, stream_order=True)
        # two parameters' chains (update, all-gather, reshape), ready at 0
        # and 1: the first's update 0-1, all-gather 1-2, reshape 2-2.5; the
        # second's update 2.5-4.5 (behind that reshape), all-gather 4.5-5.5,
        # reshape 5.5-6
        tl.chain(0, [[(False, 1.0), (True, 1.0), (False, 0.5)],
                     [(False, 2.0), (True, 1.0), (False, 0.5)]], [0.0, 1.0])
        assert tl.run() == 6.0


def test_a_tensor_parallel_item_waits_too():
    tl = Timeline(1, stream_order=True)
    tl.compute(0, 2.0)
    assert tl.comm_on(0, 1.0, 0.0, tp=True) == 3.0


@pytest.mark.parametrize("fusion", ["none", "megatron"])
def test_a_pipeline_with_data_parallel_syncs_agrees_under_stream_order(fusion):
    """A small point where stream order shows (the step is longer than
    with collectives ordered by their inputs), estimated within the bound."""
    o = {"model": "gpt2", "topology": "dgx-a100", "dp": 2, "tp": 2, "pp": 2, "layers": 4,
         "seq": 256, "micro_batch": 1, "global_batch": 8, "zero": 1, "bucket_mb": 0,
         "network_mode": "analytical", "fusion": fusion}
    rows = {}
    for order in ("inputs", "stream"):
        row = estimate({**o, "comm_order": order})
        sim = distsim.simulate(**o, comm_order=order).summary()
        for key in ("step_time_s", "max_peak_memory_bytes"):
            assert abs(row[key] - sim[key]) <= AGREEMENT_TOLERANCE * sim[key], (order, key)
        rows[order] = (row["step_time_s"], sim["step_time_s"])
    assert rows["stream"][1] > rows["inputs"][1]    # the order shows in the simulation
    assert rows["stream"][0] > rows["inputs"][0]    # and in the estimate
