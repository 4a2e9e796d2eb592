"""The public Python API: everything the CLI does, as plain calls.

    import distsim
    result = distsim.simulate(model="mlp", topology="dgx-a100", dp=8)
    result.step_time_s, print(result.summary_table())
    result.write_outputs("distsim-out")     # summary.json, trace.json, the charts, report.html
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Union

from .cost.device import check_compute_dtype
from .cost.model import CostModel
from .errors import ConfigError
from .fileio import first_missing, refuse_file_as_folder, remove_outputs
from .ir.core import Function, gc_paused
from .ir.verifier import verify
from .ir.value_table import ValueTable
from . import option_docs
from .keywords import strict_keywords
from .models import check_batch_options, family_of, load_model_config
from .option_docs import option_names, with_option_docs
from .pages import small_pages
from .program_file import is_program_model, load_text_program
from .report import (format_summary_table, summarize, write_chrome_trace, write_gantt,
                     write_memory_plot, write_summary)
from .ir.types import DType
from .run_options import (DEFAULT_MAX_OPS, DEFAULT_MAX_TRACE_RECORDS, check_max_ops,  # noqa: F401
                          check_max_trace_records, check_network_mode)
from .report.chrome_trace import (TracePlan,
                                  plan_trace)
from .report.links import plot_links
from .report.training_metrics import format_training_metrics, peak_flops_of, training_metrics
from .sim.comm_queues import DEFAULT_COMM_STREAMS, check_comm_streams
from .sim.launch_queue import (DEFAULT_COMM_ORDER, DEFAULT_LAUNCH, DEFAULT_P2P, check_comm_order,
                               check_launch, check_p2p)
from .sim.collectives import check_algorithm_name
from .sim.simulator import SimulationOptions, simulate_function
from .sim.trace import Trace
from .topology import Topology, load_topology
from .transforms.strategy import Strategy
from .wall_clock import WallClock

DEFAULT_MODEL = "mlp"
DEFAULT_TOPOLOGY = "dgx-a100"
OUTPUT_FILES = ("summary.json", "trace.json", "gantt.png", "memory.png", "links.png",
                "report.html")
#: written as well by a pipeline run (pp > 1): a lane per pipeline stage
PIPELINE_FILE = "pipeline.png"


@dataclass
class SimulationResult:
    """What one simulation produced: the trace, the program and the config.
    Shows itself as the summary table (in a terminal and in a notebook)."""

    trace: Trace
    program: Function
    config: Dict[str, Any]
    topology: Topology
    #: bound on the timed records of trace.json (0: no limit); see write_outputs
    max_trace_records: int = DEFAULT_MAX_TRACE_RECORDS
    _summary: Optional[Dict[str, Any]] = field(default=None, repr=False)
    _plans: Dict[int, TracePlan] = field(default_factory=dict, repr=False)

    def trace_plan(self, max_trace_records: Optional[int] = None) -> TracePlan:
        """What trace.json holds under ``max_trace_records`` (None: this
        result's setting; 0: no limit): everything, or the records before a cutoff."""
        limit = check_max_trace_records(self.max_trace_records if max_trace_records is None
                                        else max_trace_records)
        if limit not in self._plans:
            self._plans[limit] = plan_trace(self.trace, limit)
        return self._plans[limit]

    @property
    def step_time_s(self) -> float:
        return self.trace.step_time_s

    def summary(self) -> Dict[str, Any]:
        """The JSON-ready summary (the content of summary.json). Its
        ``trace_file`` block says whether trace.json is truncated under
        ``max_trace_records`` (and how many records it holds)."""
        if self._summary is None:
            s = summarize(self.trace)
            s["config"] = dict(self.config)
            model = self.program.meta.get("model")
            if not isinstance(model, dict):
                model = self.config
            dtype = str(model.get("dtype") or self.config.get("dtype") or "f16")
            s.update(training_metrics(s, self.trace.meta, model, self.config,
                                      peak_flops_of(self.topology.device_spec, dtype),
                                      topology=self.topology))
            s["trace_file"] = self.trace_plan().to_dict()
            self._summary = s
        return self._summary

    def summary_table(self) -> str:
        return format_summary_table(self.summary()) + format_training_metrics(self.summary())

    def write_trace(self, path: Union[str, Path], max_trace_records: Optional[int] = None) -> None:
        """Write the Chrome trace (streaming, atomic), summarised past
        ``max_trace_records`` timed records (None: this result's setting, 0: no limit)."""
        plan = self.trace_plan(max_trace_records)
        write_chrome_trace(self.trace, path, max_trace_records=plan.max_records, plan=plan)

    def gantt(self, path: Union[str, Path], view: str = "devices") -> None:
        """The Gantt chart: a lane per device (``view="stages"``: per pipeline stage)."""
        write_gantt(self.trace, path, program=self.program, view=view)

    def pipeline_chart(self, path: Union[str, Path]) -> None:
        """The Gantt chart with a lane per pipeline stage (pipeline.png)."""
        self.gantt(path, view="stages")

    def memory_plot(self, path: Union[str, Path]) -> None:
        write_memory_plot(self.trace, path)

    def chart(self, name: str = "gantt") -> Any:
        """A chart, shown inline in a notebook (``.save(path)`` writes it):
        ``gantt``, ``pipeline``, ``memory`` or ``links``."""
        from .report.run_charts import run_chart   # matplotlib: when drawn
        return run_chart(self, name)

    def html_report(self, path: Union[str, Path]) -> Path:
        """One self-contained ``report.html``: summary, config, every chart."""
        from .report.html import write_run_report   # matplotlib and pandas: when drawn
        return write_run_report(self, path)

    def links_plot(self, path: Union[str, Path]) -> None:
        """The busiest network links: mean utilisation over time, or per link."""
        plot_links(self.trace.links, path, samples=self.trace.link_samples,
                   end_s=self.trace.step_time_s)

    def write_outputs(self, out_dir: Union[str, Path], plots: bool = True,
                      max_trace_records: Optional[int] = None,
                      progress: Optional[Callable[[str], None]] = None) -> Dict[str, Path]:
        """Write summary.json and trace.json (and with ``plots`` the PNGs,
        pipeline.png for a pipeline run, and report.html, the page that
        shows them with the summary) into ``out_dir``;
        each file atomically. trace.json holds at most ``max_trace_records``
        timed records (None: this result's setting, default
        :data:`DEFAULT_MAX_TRACE_RECORDS`; 0: no limit); past it the trace is
        summarised and summary.json's ``trace_file.truncated`` is true.
        ``progress`` is called with the name of each file as it starts.
        When a write fails (or is interrupted) in a folder this call made,
        the files written so far and the folder are removed again.
        Returns the paths written."""
        say = progress or (lambda message: None)
        if max_trace_records is not None:
            limit = check_max_trace_records(max_trace_records)
            if limit != self.max_trace_records:
                self.max_trace_records = limit
                if self._summary is not None:
                    self._summary["trace_file"] = self.trace_plan().to_dict()
        out = refuse_file_as_folder(out_dir)
        summary = self.summary()    # before the folder: a failure here leaves nothing
        # the highest folder this call makes (None: out exists), removed again on failure
        made = first_missing(out)
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:     # /proc/nope, a read-only disk, no permission
            raise ConfigError(f"--out {out}: cannot create the output folder "
                              f"({e.strerror or e})") from None
        paths = {"summary": out / "summary.json", "trace": out / "trace.json"}
        try:
            say("writing summary.json")
            write_summary(summary, paths["summary"])
            say("writing trace.json")
            self.write_trace(paths["trace"])
            if plots:     # the charts, then the page that inlines them (each drawn once)
                from .report.run_charts import write_run_charts
                write_run_charts(self, out, paths, say)
        except BaseException:
            if made is not None:   # folders of this run only: no partial set of outputs left
                remove_outputs(out, paths.values(), made)
            raise
        return paths

    def __repr__(self) -> str:
        return self.summary_table()

    def _repr_html_(self) -> str:
        """The summary as HTML tables and the Gantt chart inline (notebooks)."""
        from .report.html import result_html   # matplotlib and pandas: when drawn
        return result_html(self)


#: How long past the deadline the timer waits while the simulator runs:
#: its event loop checks the deadline every 256 events, and its own error
#: names the blocked ops.
_SIMULATION_GRACE_S = 0.2

#: Ops per layer, micro-batch and simulated device, roughly (forward,
#: backward, optimizer and communication), for the op-count estimate.
_OPS_PER_LAYER = {"mlp": 8, "gpt": 40}


def check_max_wall_s(value: Any) -> Optional[float]:
    """``max_wall_s`` (``--max-wall-s``) as a finite float > 0, or None for
    no bound (None or 0); anything else is a ConfigError."""
    if value is None or (not isinstance(value, bool) and value == 0):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or value < 0:
        raise ConfigError(f"--max-wall-s: must be a finite number of seconds >= 0 "
                          f"(0: no limit), got {value!r}")
    return float(value)


def _positive_int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def estimate_ops(config: Mapping[str, Any], strategy: Strategy) -> Optional[Dict[str, int]]:
    """A rough count of the ops the family would build (None: no estimate,
    e.g. an ONNX model, whose size is its file's): ops per layer x layers x
    micro-batches x simulated devices (each pipeline stage holds
    ``layers / pp``; a GPT with ``symmetry`` is built with one device per stage)."""
    family = config.get("family")
    per_layer = _OPS_PER_LAYER.get(str(family))
    layers = _positive_int(config.get("layers"))
    if per_layer is None or layers is None:
        return None
    microbatches = _positive_int(strategy.microbatches)
    if family == "gpt" and microbatches is None:
        gb = _positive_int(strategy.global_batch) or _positive_int(config.get("global_batch")) or 1
        mb = _positive_int(strategy.micro_batch) or _positive_int(config.get("micro_batch")) or 1
        microbatches = max(1, gb // max(1, (strategy.dp or 1) * mb))
    microbatches = microbatches or 1
    pp = max(1, strategy.pp or 1)
    devices = max(1, strategy.num_devices)
    per_stage = 1 if (family == "gpt" and strategy.symmetry) else max(1, devices // pp)
    return {"ops": per_layer * layers * microbatches * per_stage, "layers": layers,
            "microbatches": microbatches, "devices": per_stage}


def refuse_non_finite(config: Mapping[str, Any], where: str) -> None:
    """A ConfigError naming the first field of ``config`` (nested fields
    as ``input_shapes.x[0]``) that holds a NaN or an infinity: no model
    field means anything infinite, and a run must not fail only when its
    summary is written, after the simulation."""
    def walk(value: Any, name: str) -> None:
        if isinstance(value, Mapping):
            for key, item in value.items():
                walk(item, f"{name}.{key}" if name else str(key))
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk(item, f"{name}[{i}]")
        elif isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral) \
                and not math.isfinite(value):
            raise ConfigError(f"{where}: {name}: must be a finite number, got {value!r}")
    walk(config, "")


def _optimizer_of(program: Function) -> Optional[str]:
    """The optimizer the built step updates its parameters with (None: a
    forward pass, which updates nothing), as the program says."""
    if "updates" in program.meta and not program.meta["updates"]:
        return None
    optimizer = program.meta.get("optimizer")
    return str(optimizer) if optimizer is not None else None


#: The model fields the options override (``layers=`` ... ``frozen=``).
MODEL_FIELDS = option_names(option_docs.MODEL)
#: The parallel strategy's options: the fields of :class:`Strategy`.
STRATEGY_OPTIONS = tuple(f.name for f in dataclasses.fields(Strategy))
#: What :func:`build_program` builds from: the model overrides and the strategy.
PROGRAM_OPTIONS = MODEL_FIELDS + STRATEGY_OPTIONS


def _given(arguments: Mapping[str, Any]) -> Dict[str, Any]:
    """The program options among a call's ``arguments`` that are set (not None)."""
    return {name: arguments[name] for name in PROGRAM_OPTIONS if arguments[name] is not None}


@strict_keywords
@with_option_docs(option_docs.MODEL, option_docs.STRATEGY, option_docs.BUILD)
def build_program(model: Union[str, Mapping[str, Any]] = DEFAULT_MODEL,
                  topology: Union[str, Topology] = DEFAULT_TOPOLOGY, *,
                  layers: Optional[int] = None, hidden: Optional[int] = None,
                  batch: Optional[int] = None, dtype: Optional[str] = None,
                  seq: Optional[int] = None, heads: Optional[int] = None,
                  kv_heads: Optional[int] = None, ffn: Optional[int] = None,
                  vocab: Optional[int] = None, attention: Optional[str] = None,
                  attention_kernel: Optional[str] = None,
                  routing_skew: Optional[float] = None,
                  capacity_factor: Optional[float] = None,
                  dispatch: Optional[str] = None,
                  train: Optional[bool] = None,
                  input_shapes: Optional[Mapping[str, Any]] = None,
                  frozen: Optional[Sequence[str]] = None,
                  dp: Optional[int] = None, tp: Optional[int] = None, pp: Optional[int] = None,
                  cp: Optional[int] = None, cp_comm: Optional[str] = None,
                  sp: Optional[bool] = None, zero: Optional[int] = None,
                  recompute: Optional[str] = None, global_batch: Optional[int] = None,
                  microbatches: Optional[int] = None, micro_batch: Optional[int] = None,
                  schedule: Optional[str] = None, virtual_stages: Optional[int] = None,
                  bucket_mb: Optional[float] = None, optimizer: Optional[str] = None,
                  partition: Optional[str] = None, prefetch: Optional[int] = None,
                  zero3_unit: Optional[str] = None, order: Optional[str] = None,
                  plan: Optional[str] = None, fusion: Optional[str] = None,
                  ep: Optional[int] = None, tp_overlap: Optional[bool] = None,
                  fp32_grads: Optional[bool] = None, p2p_scatter: Optional[bool] = None,
                  symmetry: Optional[bool] = None, coarsen: Optional[bool] = None,
                  max_ops: Optional[int] = None, verify_program: bool = True) -> tuple:
    """Resolve the model config, topology and strategy and build the
    local-view program. Returns ``(program, config, topology)``: the
    program, the resolved configuration (``summary.json``'s ``config``)
    and the :class:`Topology`.

    ``model`` and ``topology`` are as for :func:`simulate`; the other
    options are keyword-only and named as the ``distsim print`` and
    ``distsim simulate`` flags (``kv_heads`` is ``--kv-heads``). An unknown
    name is a ConfigError naming the closest one.

    @options
    """
    options = _given(locals())
    return _build_program(model, topology, max_ops, verify_program, options)


def _build_program(model: Union[str, Mapping[str, Any]], topology: Union[str, Topology],
                   max_ops: Optional[int], verify_program: bool,
                   options: Dict[str, Any]) -> tuple:
    """:func:`build_program` on the program options that are set."""
    op_limit = check_max_ops(max_ops)
    topo = topology if isinstance(topology, Topology) else load_topology(str(topology))
    if is_program_model(model):      # a DistIR text program: its own shapes and placements
        program, resolved = load_text_program(str(model), topo.ranks, topo.name, options)
        if op_limit and len(program.ops) > op_limit:
            raise ConfigError(f"{model}: {len(program.ops):,} ops, more than --max-ops "
                              f"{op_limit:,} (0: no limit)")
        return program, resolved, topo
    config = load_model_config(model)
    check_batch_options(options.get("batch"), options.get("global_batch"))
    for key in MODEL_FIELDS:
        if options.get(key) is not None:
            value = options.pop(key)
            if key == "batch" and config.get("family") == "gpt":
                key = "global_batch"  # --batch is the global batch of a GPT
            elif key == "dtype" and config.get("family") == "gpt":
                value = DType.parse(str(value)).value
            config[key] = value
        else:
            options.pop(key, None)
    model_name = config.get("name") or config.get("family")
    check_compute_dtype(topo.device_spec, config.get("dtype") or
                        family_of(config).defaults.get("dtype"), model_name, topo.source)
    requested_optimizer = options.get("optimizer")
    strategy = Strategy.from_mapping(options).resolved(topo.num_devices)
    if strategy.cp > 1 and config.get("family") != "gpt":
        raise ConfigError(f"--cp {strategy.cp}: context parallelism is modelled for GPT models "
                          f"only, not for model '{model_name}' (family "
                          f"{config.get('family')})")
    if strategy.num_devices > topo.num_devices:
        raise ConfigError(f"the strategy needs {strategy.num_devices} devices "
                          f"(dp {strategy.dp} x tp {strategy.tp} x pp {strategy.pp}"
                          + (f" x cp {strategy.cp}" if strategy.cp > 1 else "")
                          + f") but topology "
                          f"'{topo.name}' has {topo.num_devices}")
    # the families lowered by LowerSPMD (transformers, imported ONNX models)
    # use every device: a smaller mesh would leave GPUs idle unnoticed
    if config.get("family") in ("gpt", "onnx") and strategy.num_devices != topo.num_devices:
        cp = f" x {strategy.cp}" if strategy.cp > 1 else ""
        raise ConfigError(f"dp x tp x pp{' x cp' if cp else ''} = {strategy.dp} x {strategy.tp} "
                          f"x {strategy.pp}{cp} = {strategy.num_devices} does not match the "
                          f"{topo.num_devices} devices of topology '{topo.name}'")
    estimate = estimate_ops(config, strategy) if op_limit else None
    if estimate is not None and estimate["ops"] > op_limit:
        raise ConfigError(
            f"model '{config.get('name')}': about {estimate['ops']:,} ops to build "
            f"({estimate['layers']:,} layers x {estimate['microbatches']:,} micro-batches x "
            f"{estimate['devices']:,} devices per stage), more than --max-ops {op_limit:,}; use "
            f"fewer layers or micro-batches"
            + (", or --symmetry" if config.get("family") == "gpt" and not strategy.symmetry
               else "") + " (--max-ops 0: no limit)")
    # the cyclic collector paused while the step is built, template
    # included (see gc_paused: its passes walk the growing objects again
    # and again; lowering pauses it too)
    with gc_paused():
        program = family_of(config).build(config, strategy)
    # after the family's own checks (their messages say more, e.g. "must be
    # positive"), before anything is simulated: a field no family checks
    refuse_non_finite(config, f"model '{model_name}'")
    # the optimizer the step really uses: the MLP's is SGD whatever the
    # strategy's default says, a forward pass has none
    optimizer = _optimizer_of(program) if "optimizer" in program.meta or \
        "updates" in program.meta else strategy.optimizer
    if requested_optimizer is not None and requested_optimizer != optimizer:
        raise ConfigError(f"--optimizer {requested_optimizer}: not supported by model "
                          f"'{model_name}' ("
                          + (f"its step updates the parameters with {optimizer})" if optimizer
                             else "it runs the forward pass only, no optimizer)"))
    if verify_program:
        verify(program, known_devices=topo.ranks)
    resolved = {"model": config.get("name"), **{k: v for k, v in config.items()
                                                  if k not in ("name",)},
                "topology": topo.name, **strategy.to_dict(), "optimizer": optimizer,
                "fusion": program.meta.get("fusion", strategy.fusion or "none")}
    built = program.meta.get("model")
    if config.get("family") == "gpt" and isinstance(built, dict):
        # batch sizes as the strategy resolved them, and the micro-batch count
        resolved.update(global_batch=built.get("global_batch"),
                        micro_batch=built.get("micro_batch"),
                        microbatches=program.meta.get("microbatches"))
    return program, resolved, topo


def _verified(program: Function, topo: Topology) -> ValueTable:
    """Verify ``program`` for ``topo`` and return the value table the
    verifier read, for the simulator's index to reuse (held by no frame
    here, so that the simulator can let go of it once indexed)."""
    values = ValueTable(program)
    verify(program, known_devices=topo.ranks, values=values)
    return values


@strict_keywords
@with_option_docs(option_docs.MODEL, option_docs.STRATEGY, option_docs.RUN)
def simulate(model: Union[str, Mapping[str, Any]] = DEFAULT_MODEL,
             topology: Union[str, Topology] = DEFAULT_TOPOLOGY, *,
             layers: Optional[int] = None, hidden: Optional[int] = None,
             batch: Optional[int] = None, dtype: Optional[str] = None,
             seq: Optional[int] = None, heads: Optional[int] = None,
             kv_heads: Optional[int] = None, ffn: Optional[int] = None,
             vocab: Optional[int] = None, attention: Optional[str] = None,
             attention_kernel: Optional[str] = None,
             routing_skew: Optional[float] = None, capacity_factor: Optional[float] = None,
             dispatch: Optional[str] = None,
             train: Optional[bool] = None, input_shapes: Optional[Mapping[str, Any]] = None,
             frozen: Optional[Sequence[str]] = None,
             dp: Optional[int] = None, tp: Optional[int] = None, pp: Optional[int] = None,
             cp: Optional[int] = None, cp_comm: Optional[str] = None,
             sp: Optional[bool] = None, zero: Optional[int] = None,
             recompute: Optional[str] = None, global_batch: Optional[int] = None,
             microbatches: Optional[int] = None, micro_batch: Optional[int] = None,
             schedule: Optional[str] = None, virtual_stages: Optional[int] = None,
             bucket_mb: Optional[float] = None, optimizer: Optional[str] = None,
             partition: Optional[str] = None, prefetch: Optional[int] = None,
             zero3_unit: Optional[str] = None, order: Optional[str] = None,
             plan: Optional[str] = None, fusion: Optional[str] = None,
             ep: Optional[int] = None, tp_overlap: Optional[bool] = None,
             fp32_grads: Optional[bool] = None, p2p_scatter: Optional[bool] = None,
             symmetry: Optional[bool] = None, coarsen: Optional[bool] = None,
             network_mode: str = "flow", collective_algo: str = "auto",
             comm_streams: str = DEFAULT_COMM_STREAMS, launch: str = DEFAULT_LAUNCH,
             comm_order: str = DEFAULT_COMM_ORDER, p2p: str = DEFAULT_P2P,
             max_ops: Optional[int] = None, max_wall_s: Optional[float] = None,
             max_trace_records: Optional[int] = None, record_links: bool = False,
             progress: Optional[Callable[[str], None]] = None) -> SimulationResult:
    """Build the training step of ``model`` under a parallel strategy and
    simulate it on ``topology``; returns a :class:`SimulationResult`.

    ``model``: a name (``distsim models``: ``mlp``, ``gpt3-175b``,
    ``gpt2-tiny``, ...), a path to a model ``.yaml`` or ``.onnx`` file, a
    mapping of a model's fields, or a DistIR text program (``FILE.dir``,
    its ``@main`` or its only function: an annotated one is propagated
    and lowered first, a per-device one runs as written; model and
    strategy options are refused for it). ``topology``: a name (``distsim
    topology``: ``dgx-a100``, clusters ``dgx-a100-x16``), a path to a
    ``.yaml`` file, or a :class:`Topology`. Every other option is
    keyword-only and named as the ``distsim simulate`` flag (``kv_heads``
    is ``--kv-heads``); an unknown name is a ConfigError naming the closest
    one, and numpy numbers count as Python's.

    @options
    """
    options = _given(locals())
    trace_limit = check_max_trace_records(max_trace_records)
    wall = check_max_wall_s(max_wall_s)
    check_network_mode(network_mode)
    check_algorithm_name(collective_algo)
    check_comm_streams(comm_streams)
    check_launch(launch)
    check_comm_order(comm_order)
    check_p2p(p2p)
    if not isinstance(record_links, bool):
        raise ConfigError(f"distsim.simulate: record_links: must be True or False, "
                          f"got {record_links!r}")
    if progress is not None and not callable(progress):
        raise ConfigError(f"distsim.simulate: progress: must be a function of one message, "
                          f"got {progress!r}")
    say = progress or (lambda message: None)
    # small pages: hundreds of big short-lived arrays (see distsim.pages)
    with small_pages(), WallClock(wall) as clock:
        with clock.phase("building the program"):
            say("building the program")
            program, config, topo = _build_program(model, topology, max_ops, False, options)
        with clock.phase("verifying the program"):
            # held in a list the call empties: no frame here keeps the table
            # once the simulator lets go of it (see _verified)
            verified = [_verified(program, topo)]
        say(f"simulating {len(program.ops):,} ops on {topo.num_devices:,} devices")
        config.update(network_mode=network_mode, collective_algo=collective_algo,
                      comm_streams=comm_streams, launch=launch, comm_order=comm_order,
                      p2p=p2p)
        # Symmetry: a family that built a reduced program (meta "represents")
        # has applied it already; otherwise the simulator finds the classes.
        symmetry = bool(config.get("symmetry")) and not program.meta.get("represents")
        options_ = SimulationOptions(network_mode=network_mode,
                                     collective_algorithm=collective_algo,
                                     comm_streams=comm_streams, launch=launch,
                                     comm_order=comm_order, p2p=p2p,
                                     symmetry=symmetry,
                                     max_wall_s=clock.remaining(), record_links=record_links)
        # the event loop stops itself at the deadline, naming the blocked
        # ops; the timer (a moment later) bounds what comes before and after it
        with clock.phase("simulating", grace_s=_SIMULATION_GRACE_S):
            trace = simulate_function(program, topo, CostModel(topo.device_spec), options_,
                                      values=verified.pop())
    return SimulationResult(trace, program, config, topo, max_trace_records=trace_limit)
