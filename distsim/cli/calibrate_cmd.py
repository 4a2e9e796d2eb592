"""``distsim calibrate MEASUREMENTS.json ...``: a device's figures fitted to
microbenchmarks (:func:`distsim.calibrate`), printed beside the
measurements, and written into a topology file."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..calibration import calibrate
from ..errors import ConfigError


def add_parser(sub) -> None:
    p = sub.add_parser(
        "calibrate", help="fit a device's figures to microbenchmark measurements",
        description="Fit a device's compute figures to microbenchmark measurements (the JSON "
                    "that reports/calibration/measure_gpu.py writes on the GPU): the GEMM "
                    "model (efficiency per dtype at the clock of a long run, per-tile "
                    "overhead, tile and wave effects), FlashAttention's forward and backward "
                    "efficiency, the bandwidth each kernel class reaches, the CUDA cores' "
                    "rate and the launch overhead; each from its own section, a missing "
                    "section leaving its figures out. Prints each measurement beside the "
                    "fitted model's time. With --update or --out, writes the figures, each "
                    "under a comment naming its source, into a topology file; every check "
                    "runs first, so a bad measurement leaves no file. Several files are "
                    "fitted together, each keeping its own clock level.",
        epilog="Measurements are never end-to-end training times: those are for validating "
               "the figures (reports/validation/).")
    p.add_argument("measurements", nargs="+", metavar="MEASUREMENTS",
                   help="a JSON file of measurements (measure_gpu.py's output)")
    p.add_argument("--topology", metavar="NAME",
                   help="the topology (name or .yaml) that gives what the measurements lack: "
                        "peaks, bandwidth, SM count, GEMM tiles; with --out, the file the "
                        "output copies (default: --update's file)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--update", metavar="YAML",
                     help="write the figures into this topology file's device block, keeping "
                          "its other lines")
    out.add_argument("--out", metavar="YAML",
                     help="write a new file: --topology's file with the figures, or without "
                          "--topology the device block alone (to paste into a topology file)")
    p.add_argument("--dtype", action="append", metavar="DTYPE",
                   help="fit only these GEMM dtypes (repeatable; default: every dtype "
                        "measured); a dtype without measurements is an error")
    p.add_argument("--reference", metavar="SERIES",
                   help="the GEMM series whose clock the efficiencies are given at (default: "
                        "a layer loop, else GEMMs back to back, else the first series)")
    p.add_argument("--json", action="store_true",
                   help="print the figures and every fit as JSON")
    p.set_defaults(func=run)


def _yaml_target(flag: str, path: str) -> Path:
    target = Path(path)
    if target.is_dir():
        raise ConfigError(f"{flag} {path}: is a directory, expected a .yaml file")
    if target.suffix.lower() not in (".yaml", ".yml"):
        raise ConfigError(f"{flag} {path}: the output is a topology file; name a .yaml file")
    if flag == "--update" and not target.is_file():
        raise ConfigError(f"{flag} {path}: topology file not found")
    if flag == "--out" and not target.parent.is_dir():
        raise ConfigError(f"{flag} {path}: the folder {target.parent} does not exist")
    return target


def run(args: argparse.Namespace) -> int:
    target = None
    if args.update:
        target = _yaml_target("--update", args.update)
    elif args.out:
        target = _yaml_target("--out", args.out)
    base = args.topology or args.update
    cal = calibrate(args.measurements, topology=base, dtypes=args.dtype,
                    reference=args.reference)
    if target is not None:
        cal.write(target, update=bool(args.update))
    if args.json:
        json.dump(cal.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(cal.report())
        if target is not None:
            print(f"\nwrote {target}")
    return 0
