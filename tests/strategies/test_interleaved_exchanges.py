"""The interleaved schedule's transfers sit where Megatron-LM's
``forward_backward_pipelining_with_interleaving`` (2021-2022) issues them
(:mod:`distsim.transforms.pipeline_exchanges`): after each warm-up
forward, after each steady forward/backward pair (one combined exchange),
after each cool-down backward.

Times by hand on 2 stages, 2 virtual stages, 4 micro-batches of the tiny
GPT with one layer a chunk, :class:`test_schedules.LayerCost` (a layer's
forward ``f`` = 6 ms: six matmuls; its backward ``b`` = 12 ms) and
transfers of ``x`` = 2 hops of latency (the star's links are near
infinitely fast). Rank 0 runs chunks 0 and 2, rank 1 chunks 1 and 3;
without communication the step is ``9 (f + b)`` = 162 ms (``(m + (p - 1) /
v)`` stage-times of ``v (f + b)``), and the tied embedding's gradient is
all-reduced at the end (a 2-rank ring: two steps of ``x``)."""
import pytest

from distsim.models import load_model_config
from distsim.models.gpt_family import build_gpt
from distsim.sim.simulator import SimulationOptions, simulate_function
from distsim.transforms.pipeline import program_order, schedule_tasks
from distsim.transforms.pipeline_exchanges import megatron_calls
from distsim.transforms.strategy import Strategy

from test_schedules import LayerCost, star

MS = 1e-3
F, B = 6 * MS, 12 * MS


def step_time(p2p: str, latency_us: float) -> float:
    config = {**load_model_config("tiny"), "layers": 4, "dropout": 0.0}
    strategy = Strategy(dp=1, tp=1, pp=2, microbatches=4, schedule="interleaved",
                        virtual_stages=2, global_batch=4, micro_batch=1, fusion="none")
    topo = star(2, latency_us=latency_us)
    trace = simulate_function(build_gpt(config, strategy), topo,
                              LayerCost(topo.device_spec, 4),
                              SimulationOptions(network_mode="analytical", p2p=p2p,
                                                comm_order="stream"))
    return trace.step_time_s


def test_megatrons_calls_by_hand():
    # rank 0: 4 warm-up forwards (F(mb, chunk): F00 F10 F02 F12), then pairs
    # F20+B02, F30+B12, F22+B00, F32+B10, then B22 B32 B20 B30
    tasks = schedule_tasks("interleaved", 2, 4, 2)
    calls = megatron_calls(2, 2, 0, tasks[0])
    # (after how many tasks, what it sends, receives a forward input, a gradient)
    assert [(n, [t[1:] for t in sent], rf, rb) for n, sent, rf, rb in calls] == [
        (0, [], 0, 0),                      # rank 0 receives no first input
        (1, [(0, 0)], 0, 0),                # next forward is chunk 0 again: no receive
        (2, [(1, 0)], 1, 0),
        (3, [(0, 2)], 1, 0),
        (4, [(1, 2)], 0, 1),                # last warm-up: the first gradient too
        # forward output, backward input gradient; F30 (chunk 0) needs no input
        (6, [(2, 0), (0, 2)], 0, 1),
        (8, [(3, 0), (1, 2)], 1, 1),        # F22's input, made by rank 1's F21
        (10, [(2, 2)], 1, 1),               # B00 (chunk 0) sends nothing
        (12, [(3, 2)], 0, 1),               # the last steady call receives no input
        (13, [(2, 2)], 0, 1),
        (14, [(3, 2)], 0, 1),
        (15, [], 0, 1),
        (16, [], 0, 0)]
    # rank 1 (the last): 2 warm-up forwards, the last chunk's outputs not sent
    calls = megatron_calls(2, 2, 1, tasks[1])
    assert calls[0] == (0, [], 1, 0)
    assert calls[2][1:] == ([("F", 1, 1)], 1, 0)    # no gradient from downstream
    assert [n for n, *_ in calls] == [0, 1, 2, 4, 6, 8, 10, 12, 14, 15, 16]


def test_each_transfer_sits_between_its_sender_and_its_consumer():
    order, sends = program_order("interleaved", 4, 8, 2, lambda t: 2.0 if t[0] == "B" else 1.0)
    at = {task: i for i, (_, task, _, _) in enumerate(order)}
    placed = {t: i for i, sent in enumerate(sends) for t in sent}
    assert sorted(placed) == sorted(at)         # every task's outputs, once
    for (kind, mb, c), i in placed.items():
        consumer = (kind, mb, c + 1) if kind == "F" else (kind, mb, c - 1)
        assert at[(kind, mb, c)] < i <= at.get(consumer, len(order))


@pytest.mark.parametrize("latency_us", [250.0, 1000.0])
def test_synchronous_step_time_by_hand(latency_us):
    # Every call is an exchange of both ranks, so they go in lockstep: a
    # call ends x after the later rank reaches it (2x when two transfers go
    # the same way). Warm-up: F00 x F10/F01 x F02/F11 x; rank 1 runs F03 B03
    # while rank 0 runs F12 and then waits for B03's gradient (x); five
    # steady rounds of f + b each end in an exchange of 2x, 2x, 2x, x (two
    # transfers one way in the first three); rank 1's last pair F33 B33
    # against rank 0's B22 (x), then B32 / B21 (x), B20 / B31 (x), B30:
    # 9 f + 9 b + 14 x, then the tied embedding's all-reduce (2 x).
    x = 2 * latency_us * 1e-6
    assert step_time("synchronous", latency_us) == pytest.approx(9 * F + 9 * B + 16 * x,
                                                                  rel=1e-9)


@pytest.mark.parametrize("latency_us", [250.0, 1000.0])
def test_async_step_time_by_hand(latency_us):
    # The sender goes on; a transfer still waits for the compute both ends
    # issued before it. Critical path: F00 x F01 x F11 x F03 B03 x F13 B13
    # x F21 B01 x F31 B11 x F32 B10 x F33 B33 x B32 x B31 x B30: 9 f + 9 b
    # + 11 x, then the all-reduce (2 x). (The forward's output goes with
    # the backward after it, as in Megatron-LM: F21's with B01.)
    x = 2 * latency_us * 1e-6
    assert step_time("async", latency_us) == pytest.approx(9 * F + 9 * B + 13 * x, rel=1e-9)
