"""What building GPT-3's one-rank step costs by the hand-written builder
and by the megatron plan on the generic path (tp 8, micro-batch 1,
forward + backward, no lowering), for 2, 4 and 8 layers; and how many
times the propagation builds the whole sharded program (one build, plus
one per trial placement of an input the plan leaves to it:
:mod:`distsim.transforms.sharding.entry_inputs`; with sp the propagation
runs twice, the position table's gradient found partial the first time).
Each plan row starts with the validity answers forgotten
(:func:`~distsim.transforms.sharding.validity.combination_error`
remembers them within a process).

    PYTHONPATH=. python reports/gpt-one-path/propagation_cost.py
"""
import time
from dataclasses import replace

import distsim.transforms.sharding.entry_inputs as entry_inputs
import distsim.transforms.sharding.validity as validity
from distsim.models.gpt import gpt_forward
from distsim.models.gpt_family import build_gpt_step, gpt_config
from distsim.models.registry import load_model_config
from distsim.transforms.megatron_plan import megatron_plan
from distsim.transforms.parallelize import template_step
from distsim.transforms.strategy import Strategy

builds = 0
charge = entry_inputs.program_charge


def counted(f, memo=None):
    global builds
    builds += 1       # place_entry_inputs charges each program it builds, once
    return charge(f, memo)


entry_inputs.program_charge = counted


def seconds(fn, repeat):
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def main():
    gpt3 = gpt_config(load_model_config("gpt3-175b"))
    print(f"{'layers':>6} {'sp':>5} | {'hand s':>7} {'plan s':>7} {'x':>6} | builds")
    for layers in (2, 4, 8):
        for sp in (False, True):
            global builds
            c = replace(gpt3, layers=layers)
            s = Strategy(dp=1, tp=8, sp=sp)
            hand = seconds(lambda: build_gpt_step(c, s, 1), 20)

            def plan():
                forward = gpt_forward(c, micro_batch=1, pad_for=8)
                template_step(forward, s, megatron_plan(forward), "gpt")

            builds = 0
            validity._ERRORS.clear()
            by_plan = seconds(plan, 1)
            print(f"{layers:>6} {str(sp):>5} | {hand:7.3f} {by_plan:7.3f} {by_plan / hand:6.0f} |"
                  f" {builds:>6}", flush=True)


if __name__ == "__main__":
    main()
