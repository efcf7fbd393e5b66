"""Write a copy of a GGUF model with every quantized weight dequantized to F32.

    pip install --target /tmp/gguf_pkg gguf pyyaml     # not a kvdesk dependency
    PYTHONPATH=/tmp/gguf_pkg .venv/bin/python benchmarks/gguf_f32.py MODEL.gguf OUT.gguf

The same function as the quantized model, computed without llama.cpp's CPU activation
quantization: a Q4_1 weight's dot products run against activations rounded to q8_1, which makes
the logits jump by a fixed amount at ANY change of the KV (RESULTS.md, "The high-rate floor").
KV-quantization experiments on the copy see the codec's loss without that noise floor. For
measurements only; nothing in kvdesk reads this file.
"""

from __future__ import annotations

import sys

import numpy as np

try:
    import gguf
    from gguf.quants import dequantize
except ImportError as e:  # pragma: no cover - a measuring tool's optional dependency
    raise SystemExit(f"needs the gguf package ({e}); see this script's docstring") from None


def main(src: str, dst: str) -> None:
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type"):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(name, field.contents(), kind, sub_type=field.types[-1])
        else:
            writer.add_key_value(name, field.contents(), kind)
    for t in reader.tensors:
        writer.add_tensor(t.name, dequantize(t.data, t.tensor_type).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main(*sys.argv[1:3])
