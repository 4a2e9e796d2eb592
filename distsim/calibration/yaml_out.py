"""Writing a calibration into a topology file.

The calibrated figures go into the file's ``device`` block as one marked
section, each figure under a comment saying where it comes from:

    device:
      name: ...
      peak_flops: ...
      # --- calibrated by `distsim calibrate` (rerun it rather than edit): h100.json ---
      # per kernel, on the device's timeline (h100.json: launch...)
      launch_overhead_s: 3.68e-06
      ...
      # --- end of calibrated figures ---

Updating a file replaces that section (or, the first time, the lines of
the figures it writes, with the comment lines just above each) and keeps
every other line and comment as it was. The result is loaded as a
topology before it replaces the file, atomically: a failure leaves the
file as it was and no partial output.
"""
from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path
from typing import Any, List, Tuple

import yaml

from ..errors import ConfigError
from ..fileio import write_text_atomic

BEGIN = "# --- calibrated by `distsim calibrate`"
END = "# --- end of calibrated figures ---"
_KEY = re.compile(r"^  ([A-Za-z_][A-Za-z0-9_]*):")
_WIDTH = 96


def _scalar(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, float):
        # YAML 1.1 reads a float only with a dot, and an exponent only with its sign
        mantissa, _, exponent = f"{value:.4g}".partition("e")
        mantissa += "" if "." in mantissa else ".0"
        return mantissa + (f"e{exponent}" if exponent else "")
    return yaml.safe_dump(value, default_flow_style=True, width=1 << 20).strip().removesuffix(
        "\n...").strip()


def _flow(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    return _scalar(value)


def _comment(text: str, indent: str) -> List[str]:
    out = []
    for para in text.split("\n"):
        out += textwrap.wrap(para, _WIDTH - len(indent) - 2, break_on_hyphens=False) or [""]
    return [f"{indent}# {line}".rstrip() for line in out]


def device_lines(cal) -> List[str]:
    """The marked section: every calibrated figure under its comment."""
    files = " ".join(cal.measurements.files)
    lines = [f"  {BEGIN} (rerun it rather than edit): {files} ---"]
    for key, value in cal.device.items():
        lines += _comment(cal.notes.get(key, ""), "  ") if cal.notes.get(key) else []
        if isinstance(value, dict) and key in ("gemm", "attention"):
            lines.append(f"  {key}:")
            for k, v in value.items():
                if isinstance(v, dict) and key == "attention":     # kernels: one line each
                    lines.append(f"    {k}:")
                    lines += [f"      {name}: {_flow(figs)}" for name, figs in v.items()]
                else:
                    lines.append(f"    {k}: {_flow(v)}")
        else:
            lines.append(f"  {key}: {_flow(value)}")
    lines.append(f"  {END}")
    return lines


def _device_span(lines: List[str], where: str) -> Tuple[int, int]:
    """(first line inside the device block, one past its last)."""
    for i, line in enumerate(lines):
        if re.match(r"^device:\s*(#.*)?$", line):
            end = i + 1
            while end < len(lines) and (not lines[end].strip() or lines[end].startswith(" ")):
                end += 1
            while end > i + 1 and not lines[end - 1].strip():
                end -= 1
            return i + 1, end
        if re.match(r"^device:", line):
            raise ConfigError(f"{where}: device: written on one line (flow style); write it as "
                              "a block to update it")
    raise ConfigError(f"{where}: device: missing (no block to write the figures into)")


def _drop(body: List[str], keys) -> List[str]:
    """``body`` (the device block's lines) without the marked section and
    without the lines of ``keys``: the key's line, its deeper lines, and
    the comment lines at the key's indent just above it."""
    out: List[str] = []
    i = 0
    while i < len(body):
        line = body[i]
        if line.strip().startswith(BEGIN):
            while i < len(body) and not body[i].strip().startswith(END):
                i += 1
            i += 1
            continue
        m = _KEY.match(line)
        if m and m.group(1) in keys:
            while out and out[-1].startswith("  #"):
                out.pop()
            i += 1
            while i < len(body) and (body[i].startswith("   ") or not body[i].strip()):
                deeper_next = i + 1 < len(body) and body[i + 1].startswith("   ")
                if not body[i].strip() and not deeper_next:
                    break
                i += 1
            continue
        out.append(line)
        i += 1
    return out


def updated_text(text: str, cal, where: str) -> str:
    """``text`` (a topology file) with the calibration's figures."""
    lines = text.splitlines()
    start, end = _device_span(lines, where)
    keys = set(cal.device) | ({"memory_efficiency_by_op"} if cal.memory is not None else set())
    body = _drop(lines[start:end], keys)
    while body and not body[-1].strip():
        body.pop()
    return "\n".join(lines[:start] + body + device_lines(cal) + lines[end:]) + "\n"


def _check(text: str, where: str) -> None:
    from ..topology.loader import topology_from_dict
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:      # a bug of this writer, reported as such
        raise RuntimeError(f"calibrate wrote malformed YAML for {where}: {e}") from None
    topology_from_dict(data, where)


def write_calibration(cal, path: Path, update: bool) -> Path:
    where = str(path)
    if update:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"{where}: cannot read the topology file to update: "
                              f"{e.strerror or e}") from None
        new = updated_text(text, cal, where)
        _check(new, where)
    elif cal.base is not None:
        from ..topology import load_topology
        source = Path(load_topology(cal.base).source)
        new = updated_text(source.read_text(encoding="utf-8"), cal, where)
        new = re.sub(r"(?m)^name:.*$", f"name: {path.stem}", new, count=1)
        _check(new, where)
    else:
        new = _device_only(cal)
    write_text_atomic(path, new)
    return path


def _device_only(cal) -> str:
    m = cal.measurements
    head = [f"# Device figures fitted by `distsim calibrate` from {' '.join(m.files)}.",
            "# The device block alone: paste it into a topology file (with its builder and",
            "# params, or its devices and links).", "device:",
            f"  name: {json.dumps(m.gpu or 'calibrated')}"]
    if m.peak_flops:
        head.append(f"  peak_flops: {_flow({d: v for d, (v, _) in m.peak_flops.items()})}")
    if m.memory_bandwidth_Bps:
        head.append(f"  memory_bandwidth_Bps: {_flow(m.memory_bandwidth_Bps[0])}")
    if m.memory_bytes:
        head.append(f"  memory_bytes: {_flow(float(m.memory_bytes))}")
    return "\n".join(head + device_lines(cal)) + "\n"
