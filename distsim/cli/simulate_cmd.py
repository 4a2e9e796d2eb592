"""``distsim simulate``: simulate one training step and write the reports."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..api import DEFAULT_MODEL, OUTPUT_FILES, PIPELINE_FILE, simulate
from ..errors import ConfigError
from ..fileio import first_missing, refuse_file_as_folder
from ..program_file import is_program_model
from ..report.chrome_trace import DEFAULT_MAX_TRACE_RECORDS
from ..report.summary import summary_json
from ..sim.comm_queues import COMM_STREAM_MODES, DEFAULT_COMM_STREAMS
from ..sim.launch_queue import (COMM_ORDERS, DEFAULT_COMM_ORDER, DEFAULT_LAUNCH, DEFAULT_P2P,
                                LAUNCH_MODES, P2P_MODES)
from .options import (add_model_options, add_onnx_options, add_strategy_options,
                      add_topology_option, program_options)
from .status_line import StatusLine
from .stdout import printed_or_removed


def add_parser(sub) -> None:
    p = sub.add_parser(
        "simulate", help="simulate one training step (default: an MLP, data-parallel on dgx-a100) "
             "or a DistIR text program",
        description="Simulate one training step of a model under a parallel strategy on a "
                    "topology. Prints a summary table (or JSON with --json) and writes "
                    + ", ".join(OUTPUT_FILES) + f" (and {PIPELINE_FILE} for a pipeline run) "
                    "into the output folder.")
    p.add_argument("program", nargs="?", metavar="FILE.dir",
                   help="a DistIR text program (or an example's name: nested_mlp) to simulate "
                        "instead of --model (its @main, or its only function, as `distsim "
                        "print` writes one): an annotated "
                        "one (meshes, placements, calls) is propagated and lowered first, a "
                        "per-device one runs as written")
    add_model_options(p)
    add_onnx_options(p)
    add_strategy_options(p)
    add_topology_option(p)
    g = p.add_argument_group("simulation")
    g.add_argument("--network-mode", choices=["flow", "analytical"], default="flow",
                   help="flow: max-min fair sharing of links; analytical: alpha-beta on each "
                        "route's bottleneck, no contention (default: %(default)s)")
    g.add_argument("--collective-algo", default="auto",
                   help="collective algorithm: auto, ring, tree, hierarchical, ... "
                        "(default: %(default)s)")
    g.add_argument("--comm-streams", choices=COMM_STREAM_MODES, default=DEFAULT_COMM_STREAMS,
                   help="per-group: one communication stream per process group (team of "
                        "ranks), as NCCL communicators run: a tensor-parallel all-reduce does "
                        "not wait for a data-parallel one issued before it, they share only "
                        "links; shared: one stream per device for every collective, in program "
                        "order (point-to-point transfers have a queue per peer either way; "
                        "default: %(default)s)")
    g.add_argument("--launch", choices=LAUNCH_MODES, default=DEFAULT_LAUNCH,
                   help="async: kernel launches return at once and the host issues kernels "
                        "ahead of the device; blocking: each launch waits for its kernel to "
                        "finish, as under CUDA_LAUNCH_BLOCKING=1, so a device runs one "
                        "kernel, collective or group of point-to-point transfers at a time, "
                        "in program order, with no overlap of compute and communication, and "
                        "pays the host's launch time (host_launch_s) before each "
                        "(default: %(default)s)")
    g.add_argument("--comm-order", choices=COMM_ORDERS, default=DEFAULT_COMM_ORDER,
                   help="inputs: a collective starts once its inputs are ready and every "
                        "member has reached it, overlapping compute issued before it; stream: "
                        "also no earlier than the end of the compute op issued before it on "
                        "its device, as PyTorch's ProcessGroupNCCL orders its streams "
                        "(default: %(default)s)")
    g.add_argument("--p2p", choices=P2P_MODES, default=DEFAULT_P2P,
                   help="how the training engine issues pipeline transfers: async: a "
                        "stage's transfers as one group (batch_isend_irecv) and the host "
                        "goes on, so compute after a send overlaps it (Megatron-core with "
                        "overlap_p2p_comm); synchronous: grouped, and whatever the device "
                        "issues next waits for the whole group, sends included (Megatron-LM "
                        "2021-2022: torch.cuda.synchronize() after each); separate: each "
                        "send and receive its own call, a device's transfers one after "
                        "another, one launch each under --launch blocking, what follows "
                        "waiting for them (DeepSpeed's pipeline engine) "
                        "(default: %(default)s)")
    g.add_argument("--max-wall-s", type=float, dest="max_wall_s", default=0.0, metavar="S",
                   help="stop a simulation still running after S seconds of wall-clock time "
                        "with an error listing the blocked ops per device (exit status 2); "
                        "0: no limit (default: %(default)g). A deadlock is always reported "
                        "at once, and a run stops after 10,000,000 events without an op "
                        "finishing")
    o = p.add_argument_group("output")
    o.add_argument("--out", default="distsim-out",
                   help="output folder for the trace, plots and summary (default: %(default)s)")
    o.add_argument("--json", action="store_true",
                   help="print the summary as JSON on stdout instead of the table")
    o.add_argument("--no-plots", action="store_true",
                   help="skip gantt.png, pipeline.png, memory.png, links.png and report.html")
    o.add_argument("--no-link-samples", action="store_true",
                   help="do not record link utilisation over time (links.png then shows "
                        "busy time per link, trace.json has no link counters; saves memory "
                        "on very large runs)")
    o.add_argument("--max-trace-records", type=int, dest="max_trace_records",
                   default=DEFAULT_MAX_TRACE_RECORDS, metavar="N",
                   help="at most N timed records (op slices + memory/link counter samples) in "
                        "trace.json; past it the trace keeps the records before a cutoff time "
                        "and summarises the rest per device stream, and summary.json's "
                        "trace_file.truncated is true; 0: no limit (default: %(default)s, "
                        "about 150 MB)")
    p.set_defaults(func=run)


def check_out(out: str) -> None:
    """Refuse an output folder that cannot be one, before the simulation
    (which may take minutes) rather than after it: an empty name (an unset
    ``--out "$DIR"`` would otherwise write into the current folder) or an
    existing file. The folder itself is made only when the run succeeds."""
    if not out.strip():
        raise ConfigError(f"--out: must name a folder, got {out!r}")
    refuse_file_as_folder(out)


def run(args: argparse.Namespace) -> int:
    check_out(args.out)
    if args.program is not None:
        if not is_program_model(args.program):
            raise ConfigError(f"{args.program}: not a DistIR text program (a .dir file or an "
                              "example's name, e.g. nested_mlp); a model is given with --model")
        if args.model != DEFAULT_MODEL:
            raise ConfigError(f"{args.program}: give a program file or --model {args.model}, "
                              "not both")
        args.model = args.program
    out = Path(args.out)
    made = first_missing(out)    # what a failed printout removes again
    # on a terminal, which phase runs (cleared before anything is printed)
    with StatusLine() as status:
        result = simulate(network_mode=args.network_mode, collective_algo=args.collective_algo,
                          comm_streams=args.comm_streams, launch=args.launch,
                          comm_order=args.comm_order, p2p=args.p2p,
                          record_links=not args.no_link_samples,
                          max_trace_records=args.max_trace_records, max_wall_s=args.max_wall_s,
                          progress=status, **program_options(args))
        try:
            paths = result.write_outputs(args.out, plots=not args.no_plots, progress=status)
        except OSError as e:        # a folder it may not write into (/proc), a full disk
            raise ConfigError(f"--out {args.out}: cannot write the output files "
                              f"({e.strerror or e})") from None
    info = result.summary().get("trace_file") or {}
    if info.get("truncated"):
        print(f"distsim: note: trace.json holds {info['records_written']} of {info['records']} "
              f"records (--max-trace-records {info['max_trace_records']}; 0: no limit)",
              file=sys.stderr)
    with printed_or_removed(paths.values(), out, made):
        if args.json:
            sys.stdout.write(summary_json(result.summary()))
        else:
            print(result.summary_table())
            print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0
