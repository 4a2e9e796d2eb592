"""Cost: device specs, the roofline cost model, memory accounting."""
from .device import DeviceSpec, device_spec_from_dict

__all__ = ["DeviceSpec", "device_spec_from_dict"]
