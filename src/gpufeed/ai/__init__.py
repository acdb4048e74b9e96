"""AI integrations on top of the fast-path client: model loading (safetensors).

Each module here uses :mod:`gpufeed.client`; none reaches into the engine.
"""

from ._models import find_safetensors, load_safetensors, load_safetensors_url, read_headers
from ._safetensors import SafetensorsError, SafetensorsHeader, TensorInfo, parse_header

__all__ = [
    "load_safetensors",
    "load_safetensors_url",
    "find_safetensors",
    "read_headers",
    "parse_header",
    "SafetensorsError",
    "SafetensorsHeader",
    "TensorInfo",
]
