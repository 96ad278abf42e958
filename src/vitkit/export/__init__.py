"""ONNX in one place.

    onnx.py    export (dynamic batch, optionally dynamic resolution), metadata, the check
               against PyTorch with onnxruntime
    int8.py    the graph with ONNX Runtime's dynamic int8 quantisation, and its check
    report.py  `vitkit export`: weights in, a checked file beside them out
"""

from vitkit.export.checked_export import default_output_path, export_weights
from vitkit.export.int8 import INT8_RTOL, check_onnx_int8, export_onnx_int8, quantize_onnx_int8
from vitkit.export.onnx import (
    FORMATS,
    check_onnx,
    default_check_sizes,
    export_onnx,
    onnx_metadata,
    read_metadata,
    require,
)

__all__ = ["FORMATS", "INT8_RTOL", "check_onnx", "check_onnx_int8", "default_check_sizes",
           "default_output_path", "export_onnx", "export_onnx_int8", "export_weights",
           "onnx_metadata", "quantize_onnx_int8", "read_metadata", "require"]
