"""What building GPT-3's one-rank step by the megatron plan costs (tp 8,
micro-batch 1, forward and backward, no lowering: ``build_gpt_step``) at
2, 4, 8 and 16 layers, and how many times the propagation builds the
whole sharded program (one build, plus one per trial placement of an
input the plan leaves to it, :mod:`distsim.transforms.sharding.entry_inputs`;
with sp the position table's trial, and the propagation run again once
its gradient is found partial). Each row starts with the sharding layer's
remembered answers forgotten (:mod:`distsim.transforms.sharding.remembered`:
they are kept within a process), and is timed in CPU seconds (the machine
is shared).

    PYTHONPATH=. python reports/gpt-one-path/propagation_cost.py
"""
import time
from dataclasses import replace

import distsim.transforms.sharding.entry_inputs as entry_inputs
from distsim.transforms.sharding.remembered import forget_all
from distsim.models.gpt_family import build_gpt_step, gpt_config
from distsim.models.registry import load_model_config
from distsim.transforms.strategy import Strategy

builds = 0
charge = entry_inputs.program_charge


def counted(f, memo=None):
    global builds
    builds += 1       # place_entry_inputs charges each program it builds, once
    return charge(f, memo)


entry_inputs.program_charge = counted


def main():
    global builds
    gpt3 = gpt_config(load_model_config("gpt3-175b"))
    print(f"{'layers':>6} {'sp':>5} | {'cpu s':>6} {'s/layer':>8} | builds")
    for layers in (2, 4, 8, 16):
        for sp in (False, True):
            c = replace(gpt3, layers=layers)
            builds = 0
            forget_all()
            start = time.process_time()
            build_gpt_step(c, Strategy(dp=1, tp=8, sp=sp), 1)
            wall = time.process_time() - start
            print(f"{layers:>6} {str(sp):>5} | {wall:6.3f} {wall / layers:8.4f} | {builds:>6}",
                  flush=True)


if __name__ == "__main__":
    main()
