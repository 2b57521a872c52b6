"""ONNX in and out: load and validate a model, import it as a tensat graph, export a graph, save a model.

- `load` reads a model (path or proto), checks it and fixes its input shapes (`load_model`);
- `importer` lowers it to the IR (`import_model`) through `IMPORTERS`, built from the operator registry;
- `exporter` emits an IR graph as ONNX for its source opset (`export_model`) through `EXPORTERS`, likewise;
- `prepass` runs a peer's canonicalization (onnxslim) on a model before it is imported (`pre_pass`);
- `save` writes a model atomically (`save_model`); `external` handles models over protobuf's 2 GiB limit;
- `common` holds what they share.

Opaque keys are `"<OpType>_<node index>"`, followed by `"@i,j"` when the ONNX node had empty (omitted optional)
inputs at positions i, j before its last input. A node whose subgraph attributes (If/Loop/Scan bodies) read tensors
of the enclosing graph has those references renamed to `__tensat_outer_<k>` inside the stored attributes and the
captured tensors appended to its IR inputs; the exporter renames them back to whatever the inputs are called then.
"""

from tensat.onnx.common import MAX_IR_VERSION, ir_version_for, run_node
from tensat.onnx.exporter import EXPORTERS, export_model
from tensat.onnx.external import PROTO_LIMIT, materialize, weight_bytes
from tensat.onnx.importer import IMPORTERS, import_model
from tensat.onnx.load import MIN_OPSET, given_model, load_model, symbolic_dims
from tensat.onnx.prepass import cached_pre_pass, pre_pass
from tensat.onnx.save import save_model
from tensat.onnx.symbolic import symbolic_inputs

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
    "cached_pre_pass",
    "pre_pass",
    "run_node",
    "save_model",
    "symbolic_dims",
    "symbolic_inputs",
    "weight_bytes",
]
