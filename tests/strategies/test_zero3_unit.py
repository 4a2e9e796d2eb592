"""ZeRO-3 by layer (``zero3_unit="layer"``): a layer's parameters are
all-gathered in one collective and their gradients reduce-scattered in
one, as FSDP does for each wrapped block, instead of one collective per
parameter. The numbers are the single-device step's
(tests/strategies/test_equivalence.py); here: what travels, and what one
collective per layer costs."""
from collections import Counter

import pytest

import distsim
from distsim.cli import main
from distsim.errors import ConfigError

#: one DGX A100: a ring over NVSwitch, 300 GB/s per GPU and direction, each
#: ring step two 0.5 us hops, under NCCL's protocols (topologies/dgx-a100.yaml:
#: NVLink at 86 % of its rate; per protocol its wire efficiency, most bus
#: bandwidth, base latency, latency a step and pipeline fill)
DP, NVLINK_BPS, PATH_S = 8, 300e9, 1e-6
PROTOCOLS = {"LL": (0.5, 40e9, 6.6e-6, 0.6e-6, 0.0),
             "LL128": (0.9375, 110e9, 14e-6, 1.9e-6, 0.0),
             "Simple": (1.0, float("inf"), 8.4e-6, 1.0e-6, 200e-6)}
CASE = dict(model="gpt3-1.3b", topology="dgx-a100", dp=DP, layers=4, global_batch=8, zero=3,
            network_mode="analytical", collective_algo="ring")


def ring_all_gather_s(nbytes: float) -> float:
    """(p - 1) steps, each its latency and 1/p of the gathered bytes, each
    rank sending (p-1)/p of them at its protocol's rate, once the base
    latency and the pipeline's fill: the fastest protocol's time."""
    sent = (DP - 1) / DP * nbytes
    times = []
    for efficiency, most, base, hop, fill in PROTOCOLS.values():
        rate = min(NVLINK_BPS * 0.86 * efficiency, most)
        times.append(base + min(sent / rate, fill) + (DP - 1) * (PATH_S + hop) + sent / rate)
    return min(times)


@pytest.fixture(scope="module")
def runs():
    return {unit: distsim.simulate(**CASE, zero3_unit=unit) for unit in ("param", "layer")}


def first_forward_gathers(result, layer):
    """(name, seconds, bytes) of rank 0's all-gathers of ``layer``'s
    parameters for micro-batch 0's forward (the first of each name)."""
    produced = {v.name: op for op in result.program.ops for v in op.outputs}
    out = []
    for o in result.trace.ops:
        op = produced[o.name]
        if (o.rank == 0 and o.op_type == "comm.allgather" and op.meta.get("layer") == layer
                and op.meta.get("microbatch") == 0 and o.name.endswith("_m0_r0")):
            out.append((o.name, o.end_s - o.start_s, op.outputs[0].type.size_bytes))
    return out


def test_one_gather_per_layer_pays_one_latency(runs):
    """Per parameter, each of layer 1's 12 gathers pays the ring's 7 step
    latencies and its protocol's base latency; by layer, one gather of the
    same bytes pays them once."""
    each = first_forward_gathers(runs["param"], 1)
    assert len(each) == 12
    for name, seconds, nbytes in each:
        assert seconds == pytest.approx(ring_all_gather_s(nbytes), rel=1e-9), name
    unit = [g for g in first_forward_gathers(runs["layer"], 1) if "_unit12_" in g[0]]
    assert len(unit) == 1
    _, seconds, nbytes = unit[0]
    assert nbytes == sum(b for _, _, b in each)
    assert seconds == pytest.approx(ring_all_gather_s(nbytes), rel=1e-9)
    saved = sum(s for _, s, _ in each) - seconds
    assert saved == pytest.approx(sum(ring_all_gather_s(b) for _, _, b in each)
                                  - ring_all_gather_s(nbytes), rel=1e-6)
    assert saved > 11 * (DP - 1) * PATH_S


def test_a_layer_travels_in_one_gather_and_one_reduce_scatter(runs):
    """Rank 0, micro-batch 0: per layer one forward gather, one backward
    gather (the weights the backward reads) and one reduce-scatter of
    the layer's 12 gradients; the same bytes as per parameter."""
    def collectives(result):
        produced = {v.name: op for op in result.program.ops for v in op.outputs}
        count, nbytes = Counter(), Counter()
        for v in (o for o in result.program.ops if o.op_type.startswith("comm.")):
            for out in v.outputs:
                if out.type.device != 0:
                    continue
                op = produced[out.name]
                if isinstance(op.meta.get("layer"), int) or op.meta.get("role") == "grad_sync":
                    count[op.op_type] += 1
                    nbytes[op.op_type] += out.type.size_bytes
        return count, nbytes
    per_param, bytes_param = collectives(runs["param"])
    per_layer, bytes_layer = collectives(runs["layer"])
    assert bytes_layer == bytes_param
    # 4 layers x 12 parameters; the embedding (2) and final norm (2) too
    assert per_param["comm.reducescatter"] == 4 * 12 + 2 + 2
    assert per_layer["comm.reducescatter"] == 4 + 1 + 1
    assert per_layer["comm.allgather"] < per_param["comm.allgather"] / 4


def test_by_layer_fewer_kernels_and_latencies_but_coarser_waits(runs):
    """By layer the copies are one kernel per layer (fewer launches) and
    the collectives pay fewer latencies; but a layer's first op waits for
    all of its parameters (per parameter only the first one's gather), so
    on this compute-bound single node more of the gathering is exposed,
    and the layer's parameters are held whole at once."""
    p, layer = runs["param"].summary(), runs["layer"].summary()
    assert layer["compute_s"] < p["compute_s"]
    assert layer["communication_s"] < p["communication_s"]
    assert layer["exposed_communication_s"] > p["exposed_communication_s"]
    assert layer["max_peak_memory_bytes"] > p["max_peak_memory_bytes"]


def test_parameters_that_do_not_split_evenly_travel_alone():
    """Hidden size 36 over dp 8: the norms and biases (36 elements) do not
    split evenly, so they are gathered per parameter; the weight matrices
    (36 x 108, ...) go by layer."""
    result = distsim.simulate(model="tiny", topology="dgx-a100", dp=8, zero=3, hidden=36,
                              heads=4, zero3_unit="layer", global_batch=8,
                              network_mode="analytical")
    names = [op.name for op in result.program.ops if op.op_type == "comm.allgather"]
    assert any("_unit" in n for n in names)
    assert any("_unit" not in n for n in names)


def test_cli_flag_and_bad_value(tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["simulate", "--model", "tiny", "--dp", "8", "--zero", "3", "--zero3-unit",
                 "layer", "--out", str(out), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert '"zero3_unit": "layer"' in captured.out
    with pytest.raises(ConfigError, match="--zero3-unit: must be one of param, layer, got .block."):
        distsim.simulate(model="tiny", zero=3, dp=8, zero3_unit="block")


def test_a_units_shards_are_settled_at_the_next_unit_not_after_its_reduce_scatter():
    """The split of a unit's reduce-scatter result is a compute op: right
    after the reduce-scatter it would hold the compute stream until the
    reduce-scatter ends (per parameter nothing reads the first
    micro-batch's result). So it comes once the next layer's backward
    has made the stage's next unit, just before that unit's copy-in
    (FSDP2 waits for a unit's reduce-scatter at the next unit's
    post-backward), or at the step's end for the last one."""
    result = distsim.simulate(model="tiny", topology="dgx-a100", dp=8, zero=3,
                              zero3_unit="layer", global_batch=8, network_mode="analytical")
    ops = [op for op in result.program.ops
           if (op.outputs[0].type.device if op.outputs else None) == 0 or
           (op.op_type.startswith("comm.") and any(v.type.device == 0 for v in op.outputs))]
    position = {id(op): i for i, op in enumerate(ops)}
    reader = {}
    for op in ops:
        for v in op.inputs:
            reader.setdefault(id(v), op)
    copy_ins = [position[id(op)] for op in ops if op.op_type == "chunk_cat"]
    scatters = [op for op in ops if op.op_type == "comm.reducescatter"]
    assert len(scatters) == len(copy_ins) == 6          # 4 layers, embedding, final norm
    for rs in scatters:
        split = reader[id(rs.outputs[0])]
        assert split.op_type == "split"
        at, settled = position[id(rs)], position[id(split)]
        later = [c for c in copy_ins if c > at]
        if later:       # the next layer's backward in between, then the next copy-in
            assert any(not op.op_type.startswith("comm.") and "phase" in op.meta
                       for op in ops[at + 1:settled])
            assert later[0] == settled + 1
        else:           # the last unit: settled at the step's end, not in the backward
            assert settled > max(copy_ins)
            assert ops[settled + 1].meta.get("phase") == "optimizer"
