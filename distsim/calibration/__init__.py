"""Calibration: device figures fitted to microbenchmark measurements
(:func:`~distsim.calibration.calibration.calibrate`, ``distsim calibrate``)."""
from .calibration import Calibration, calibrate
from .measurements import Measurements, read_measurements

__all__ = ["Calibration", "Measurements", "calibrate", "read_measurements"]
