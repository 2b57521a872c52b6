"""The ONNX layer's public names, kept importable from here; the code is in the `tensat.onnx` package."""

from tensat.onnx import (
    EXPORTERS,
    IMPORTERS,
    MAX_IR_VERSION,
    MIN_OPSET,
    PROTO_LIMIT,
    export_model,
    given_model,
    import_model,
    ir_version_for,
    load_model,
    materialize,
    pre_pass,
    run_node,
    save_model,
    symbolic_inputs,
    weight_bytes,
)

__all__ = [
    "EXPORTERS",
    "IMPORTERS",
    "MAX_IR_VERSION",
    "MIN_OPSET",
    "PROTO_LIMIT",
    "export_model",
    "given_model",
    "import_model",
    "ir_version_for",
    "load_model",
    "materialize",
    "pre_pass",
    "run_node",
    "save_model",
    "symbolic_inputs",
    "weight_bytes",
]
