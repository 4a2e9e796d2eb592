"""The public API is as strict as the command line: an unknown keyword is
a ConfigError naming the closest valid one (never a run with the default
in its place), numpy numbers count as Python's, every parameter is
documented in what ``help()`` shows, and the API's keywords and the CLI's
flags are the same names."""
from __future__ import annotations

import argparse
import inspect
import subprocess
import sys

import numpy as np
import pytest

import distsim
from distsim.api import MODEL_FIELDS, PROGRAM_OPTIONS, STRATEGY_OPTIONS
from distsim.cli import build_parser
from distsim.errors import ConfigError
from distsim.keywords import closest, plain
from distsim.sweep import search
from distsim.transforms.strategy import Strategy

SMALL = dict(layers=1, hidden=64, batch=64, network_mode="analytical")


@pytest.mark.parametrize("typo, meant", [("hiden", "hidden"), ("dpp", "dp"),
                                         ("micro_batches", "microbatches"),
                                         ("tensor_parallel", "tp"), ("zero_stage", "zero"),
                                         ("network", "network_mode")])
def test_simulate_refuses_a_misspelt_keyword_and_names_the_one_meant(typo, meant):
    with pytest.raises(ConfigError) as info:
        distsim.simulate(**{typo: 2})
    assert str(info.value) == (f"distsim.simulate: unknown keyword {typo!r} "
                               f"(did you mean {meant!r}?)")


def test_a_name_close_to_nothing_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="unknown keyword 'frobnicate' \\(known: .*dp.*"):
        distsim.build_program(frobnicate=1)


@pytest.mark.parametrize("call", [
    lambda: distsim.build_program("mlp", hiden=8),
    lambda: distsim.sweep({"model": "mlp"}, grids={"dp": [1, 2]}),
    lambda: search("tiny", "dgx-a100", gpu=8),
])
def test_build_program_sweep_and_search_refuse_unknown_keywords(call):
    with pytest.raises(ConfigError, match="did you mean"):
        call()


def test_positional_options_are_refused_with_the_way_to_give_them():
    with pytest.raises(ConfigError, match="takes at most 2 arguments by position"):
        distsim.simulate("mlp", "dgx-a100", "analytical")


def test_numpy_scalars_count_as_python_numbers():
    plain_run = distsim.simulate(dp=8, **SMALL)
    numpy_run = distsim.simulate(dp=np.int64(8), layers=np.int32(1), hidden=np.int64(64),
                                 batch=np.uint16(64), network_mode="analytical",
                                 max_wall_s=np.float64(600.0), max_trace_records=np.int64(10))
    assert numpy_run.step_time_s == plain_run.step_time_s
    gpt = distsim.simulate("tiny", dp=np.int64(2), tp=np.int8(2), pp=np.int64(2),
                           bucket_mb=np.float32(0.5), sp=np.bool_(True),
                           network_mode="analytical")
    assert gpt.config["tp"] == 2 and type(gpt.config["tp"]) is int
    assert gpt.config["bucket_mb"] == 0.5 and gpt.config["sp"] is True
    from_mapping = distsim.simulate({"family": "mlp", "layers": np.int64(1),
                                     "hidden": np.int64(64), "batch": np.int64(64)},
                                    network_mode="analytical")
    assert from_mapping.step_time_s == plain_run.step_time_s


def test_numpy_values_in_a_sweep_grid():
    df = distsim.sweep({"model": "mlp", **SMALL}, grid={"dp": np.array([1, 2])}, workers=1,
                       progress=False)
    assert list(df["dp"]) == [1, 2] and set(df["status"]) == {"ok"}


def test_plain_leaves_other_objects_alone():
    marker = object()
    assert plain(marker) is marker
    assert plain({"a": (np.int64(1), [np.float32(0.5)])}) == {"a": (1, [0.5])}
    assert closest("dpp", ["dp", "pp"]) == "dp"


@pytest.mark.parametrize("kwargs, message", [
    (dict(progress=5), "progress: must be a function of one message, got 5"),
    (dict(record_links="yes"), "record_links: must be True or False, got 'yes'"),
])
def test_run_options_of_the_wrong_kind(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        distsim.simulate(**SMALL, **kwargs)


def test_simulate_takes_every_model_and_strategy_option():
    params = inspect.signature(distsim.simulate).parameters
    assert set(STRATEGY_OPTIONS) == {f for f in Strategy.__dataclass_fields__}
    assert set(PROGRAM_OPTIONS) <= set(params)
    assert set(PROGRAM_OPTIONS) <= set(inspect.signature(distsim.build_program).parameters)
    assert MODEL_FIELDS[:4] == ("layers", "hidden", "batch", "dtype")


@pytest.mark.parametrize("func", [distsim.simulate, distsim.build_program, distsim.sweep.sweep,
                                  search, distsim.sweep.load_spec],
                         ids=["simulate", "build_program", "sweep", "search", "load_spec"])
def test_help_documents_every_parameter(func):
    doc = inspect.getdoc(func)
    undocumented = [name for name in inspect.signature(func).parameters
                    if f"``{name}``" not in doc and f"\n  {name} " not in doc
                    and not any(line.strip().startswith(name + " ") for line in doc.splitlines())]
    assert undocumented == []


def test_help_shows_the_whole_signature_and_the_options():
    proc = subprocess.run([sys.executable, "-c", "import distsim; help(distsim.simulate)"],
                          capture_output=True, text=True, timeout=120,
                          env={"PAGER": "cat", "TERM": "dumb", **_env()})
    assert proc.returncode == 0, proc.stderr
    for name in ("kv_heads", "zero3_unit", "microbatches", "max_wall_s", "Parallel strategy"):
        assert name in proc.stdout


def _env():
    import os
    return {k: v for k, v in os.environ.items() if k not in ("PAGER", "TERM")}


# -- the CLI's flags are the API's keywords --------------------------------

def _flags(command: str) -> set:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest for a in sub.choices[command]._actions if a.dest != "help"}


#: CLI flag -> API keyword where they differ, and why
RENAMED = {"input_shape": "input_shapes",        # given once per input; the API takes the mapping
           "no_link_samples": "record_links",    # off on the CLI, on in the API: the same switch
           "program": "model"}                   # `simulate FILE.dir`: the API takes it as model
#: what only the CLI has: where the files go and how the summary prints
#: (SimulationResult.write_outputs(out_dir, plots=...), summary() / summary_table())
CLI_OUTPUT = {"out", "json", "no_plots"}


def test_distsim_simulate_flags_are_simulate_keywords():
    api = set(inspect.signature(distsim.simulate).parameters) - {"progress"}
    cli = {RENAMED.get(f, f) for f in _flags("simulate")} - CLI_OUTPUT
    assert cli == api


def test_distsim_print_flags_are_build_program_keywords():
    api = set(inspect.signature(distsim.build_program).parameters) - {"verify_program"}
    cli = {RENAMED.get(f, f) for f in _flags("print")} - {"file"}
    assert cli == api


def test_distsim_sweep_flags_are_sweep_keywords():
    api = set(inspect.signature(distsim.sweep).parameters)
    renamed = {"out": "out_dir", "connect_timeout": "connect_timeout_s", "quiet": "progress"}
    cli = {renamed.get(f, f) for f in _flags("sweep")} - {"no_charts"}    # charts: the CLI's
    # the spec file's fields are the rest: base, grid, constraints, check; simulate is Python's
    assert cli == api - {"base_config", "grid", "constraints", "check", "simulate"}


def test_distsim_search_flags_are_search_keywords():
    api = set(inspect.signature(search).parameters)
    renamed = {"set": "base"}
    cli = {renamed.get(f, f) for f in _flags("search")} - {"top", "out"}   # how it prints
    assert cli == api - {"progress"}


# -- distsim.sweep: the package, callable ---------------------------------

def test_the_sweep_package_imports_and_calls():
    import distsim.sweep.point
    import distsim.sweep.spec as spec_module
    assert spec_module.load_spec is distsim.sweep.load_spec
    assert distsim.sweep.point.METRICS
    assert inspect.signature(distsim.sweep) == inspect.signature(distsim.sweep.sweep)
    df = distsim.sweep({"model": "mlp", **SMALL}, grid={"dp": [1, 2]}, workers=1, progress=False)
    assert len(df) == 2


def test_a_sweep_runs_a_named_example_spec(tmp_path):
    df = distsim.sweep(spec="mlp-scaling", workers=1, progress=False, max_points=100)
    assert len(df) == 36 and "dp" in df.columns


# -- the estimator takes the same options, as a dict ------------------------

def test_estimate_refuses_an_unknown_option_as_simulate_does():
    from distsim.estimate import estimate
    with pytest.raises(ConfigError, match=r"^estimate: unknown option 'micro_batches' "
                                          r"\(did you mean 'microbatches'\?\)$"):
        estimate({"model": "tiny", "micro_batches": 2})


def test_estimate_takes_numpy_numbers():
    from distsim.estimate import estimate
    plain_row = estimate({"model": "tiny", "tp": 2, "pp": 2})
    numpy_row = estimate({"model": "tiny", "tp": np.int64(2), "pp": np.int32(2)})
    assert numpy_row["step_time_s"] == plain_row["step_time_s"]


def test_estimate_and_simulate_refuse_a_device_without_the_models_dtype(tmp_path):
    from distsim.estimate import estimate
    topo = tmp_path / "f32.yaml"
    topo.write_text("name: f32\ndevice: {name: t, peak_flops: {f32: 1.0e+12}, "
                    "memory_bandwidth_Bps: 1.0e+12, memory_bytes: 1.0e+9}\n"
                    "builder: star\nparams: {devices: 8}\n")
    for run in (lambda: estimate({"model": "tiny", "topology": str(topo)}),
                lambda: distsim.simulate("tiny", str(topo))):
        with pytest.raises(ConfigError, match="device.peak_flops: no entry for bf16, the "
                                              "compute dtype of model 'tiny'"):
            run()
