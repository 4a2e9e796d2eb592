"""``distsim import``: import an ONNX model and summarize it (ops, FLOPs,
parameters, output shapes), or print it in the DistIR text format."""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from typing import Any, Dict

from ..cost.flops import op_flops
from ..importers.onnx import import_onnx
from ..ir.core import Function
from ..models.onnx_family import parse_shape, resolve_path
from ..text import print_function
from .options import add_frozen_option, input_shapes_option


def add_parser(sub) -> None:
    p = sub.add_parser("import", help="import an ONNX model: ops, FLOPs, parameters, shapes",
                       description="Import an ONNX file (or onnx-backend:NAME for a model the "
                                   "onnx package ships) and summarize it. FLOPs count a "
                                   "multiply-accumulate as 2.")
    p.add_argument("file", help="the .onnx file")
    p.add_argument("--input-shape", action="append", metavar="NAME=AxB", dest="input_shape",
                   help="shape of a graph input, e.g. input_ids=8x1024 (repeatable)")
    p.add_argument("--batch", type=int, help="batch size (dim 0 of every graph input)")
    p.add_argument("--seq", type=int, help="sequence length of symbolic sequence dims")
    p.add_argument("--dtype", help="recast floating-point tensors (f16, bf16, f32)")
    add_frozen_option(p)
    out = p.add_mutually_exclusive_group()
    out.add_argument("--print", action="store_true", help="print the imported function (text form)")
    out.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def summarize_import(f: Function) -> Dict[str, Any]:
    """Op counts, FLOPs per op type, parameter count, input and output shapes."""
    roles = f.meta.get("roles", {})
    counts = Counter(op.op_type for op in f.ops)
    flops: Counter = Counter()
    for op in f.ops:
        flops[op.op_type] += op_flops(op)
    params = sum(v.type.numel for v in f.inputs if roles.get(v.name) == "param")
    return {
        "name": f.name, "ops": sum(counts.values()), "op_counts": dict(counts.most_common()),
        "flops": float(sum(flops.values())), "flops_by_op": dict(flops.most_common()),
        "parameters": params,
        "inputs": {v.name: [list(v.type.shape), str(v.type.dtype)] for v in f.inputs
                   if roles.get(v.name) == "data"},
        "outputs": {v.name: [list(v.type.shape), str(v.type.dtype)] for v in f.outputs},
    }


def format_summary(s: Dict[str, Any]) -> str:
    lines = [f"{s['name']}: {s['ops']} ops, {s['parameters']:,} parameters, "
             f"{s['flops'] / 1e9:.3f} GFLOPs ({s['flops'] / 2e9:.3f} G multiply-accumulates)"]
    for label, key in (("input", "inputs"), ("output", "outputs")):
        for name, (shape, dtype) in s[key].items():
            lines.append(f"  {label} {name}: {dtype}[{','.join(map(str, shape))}]")
    lines.append(f"  {'op':<20} {'count':>6} {'GFLOPs':>10}")
    for op, count in s["op_counts"].items():
        lines.append(f"  {op:<20} {count:>6} {s['flops_by_op'].get(op, 0.0) / 1e9:>10.4f}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    shapes = {k: parse_shape(v) for k, v in input_shapes_option(args.input_shape).items()}
    f = import_onnx(resolve_path(args.file), input_shapes=shapes, batch=args.batch,
                    seq=args.seq, dtype=args.dtype, frozen=args.frozen)
    if args.print:
        sys.stdout.write(print_function(f))
        return 0
    summary = summarize_import(f)
    if args.json:
        json.dump(summary, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_summary(summary))
    return 0
