"""The parallel strategy of a run: how many ways each kind of parallelism
splits the step. One plain dataclass shared by the API, the CLI, model
families and sweeps."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Dict, Mapping, Optional

from ..errors import ConfigError


@dataclass(frozen=True)
class Strategy:
    """``dp``: data-parallel degree (None: every device the others leave);
    ``tp``, ``pp``: tensor- and pipeline-parallel degrees."""

    dp: Optional[int] = None
    tp: int = 1
    pp: int = 1

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "dp" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"--{f.name}: must be a positive integer, got {value!r}")

    def resolved(self, num_devices: int) -> "Strategy":
        """With ``dp`` filled in from the device count."""
        if self.dp is not None:
            return self
        other = self.tp * self.pp
        if num_devices % other:
            raise ConfigError(f"tp x pp = {other} does not divide the {num_devices} devices")
        return Strategy(**{**asdict(self), "dp": num_devices // other})

    @property
    def num_devices(self) -> int:
        return (self.dp or 1) * self.tp * self.pp

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "Strategy":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names and v is not None})
