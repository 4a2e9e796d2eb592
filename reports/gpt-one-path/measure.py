"""The GPT family's hand-written builder against the megatron plan on the
generic path: step time, peak memory and op count of both, simulated on
dgx-a100 (analytical network), two layers of each model, and whether the
two are the same program up to value names (``same``).

    PYTHONPATH=. python reports/gpt-one-path/measure.py > reports/gpt-one-path/measured.txt
"""
from distsim.models import load_model_config
from distsim.models.gpt_family import build_gpt
from distsim.models.gpt_generic import build_gpt_generic
from distsim.sim.simulator import SimulationOptions, simulate_function
from distsim.topology import load_topology
from distsim.transforms.strategy import Strategy

CASES = [
    ("gpt2", dict(dp=8)),
    ("gpt2", dict(dp=4, pp=2)),
    ("gpt2", dict(tp=2, dp=4)),
    ("gpt2", dict(tp=4, dp=2)),
    ("gpt2", dict(tp=4, dp=2, sp=True)),
    ("gpt2", dict(tp=4, pp=2)),
    ("llama2-7b", dict(tp=8)),
    ("llama2-7b", dict(tp=8, sp=True)),
    ("llama2-7b", dict(tp=4, pp=2)),
]


def main() -> None:
    topo = load_topology("dgx-a100")
    print("model      strategy                    hand ms  plan ms  x time | hand GiB  plan GiB"
          "  x mem | hand ops  plan ops | same")
    for model, kw in CASES:
        config = load_model_config(model)
        # two layers (GPT-2's vocabulary of 50257 padded by both to a multiple of tp);
        # Llama at sequence 1024
        config.update(layers=2, global_batch=8, micro_batch=1)
        if model != "gpt2":
            config["seq"] = 1024
        strategy = Strategy(**{"dp": 1, **kw})
        rows, keys = [], []
        for build in (build_gpt, build_gpt_generic):
            program = build(config, strategy)
            trace = simulate_function(program, topo,
                                      options=SimulationOptions(network_mode="analytical"))
            rows.append((trace.step_time_s, max(trace.peak_memory().values()), len(program.ops)))
            keys.append(program.structural_key())
        (ta, ma, na), (tb, mb, nb) = rows
        shown = " ".join(f"{k}={v}" for k, v in kw.items())
        print(f"{model:<10} {shown:<26} {ta * 1e3:8.3f} {tb * 1e3:8.3f} {tb / ta:7.3f} | "
              f"{ma / 2**30:8.3f} {mb / 2**30:9.3f} {mb / ma:6.3f} | {na:8d} {nb:9d} | "
              f"{'yes' if keys[0] == keys[1] else 'no'}")


if __name__ == "__main__":
    main()
