"""The CUDA rANS kernels under numba's simulator: bit-identical to the CPU path on tiny inputs.

The simulator must be switched on before numba.cuda is first imported, so the check runs in a
subprocess with NUMBA_ENABLE_CUDASIM=1. It interprets kernels in Python: inputs stay tiny.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import numpy as np
    import codec
    from codec import backend
    from codec_helpers import calibration_of, custom, random_kv

    cuda, cpu = backend.get("cuda"), backend.get("cpu")
    assert backend.active().name == "cuda"
    keys, values = random_kv((2, 8, 4), seed=11)
    cases = ["lossless", "balanced", "cachegen-2",
             custom(keys={"scale": "channel", "bins": [16, 8], "layer_edges": [0.5]},
                    sink_tokens=2, anchor_group=3)]
    for level in cases:
        blob = codec.encode(keys, values, level, backend=cpu)
        assert codec.encode(keys, values, level, backend=cuda) == blob, level
        got = codec.decode(blob, backend=cuda)
        want = codec.decode(blob, backend=cpu)
        for g, w in zip(got, want):
            assert np.array_equal(g.view(np.uint16), w.view(np.uint16)), level
    big_k, big_v = random_kv((2, 12, 128), seed=12)
    for block in (None, 128):  # a float per-head basis; an exact layer-wide one
        cal = calibration_of(big_k, big_v, block=block)
        blob = codec.encode(big_k, big_v, "high", calibration=cal, backend=cpu)
        assert codec.encode(big_k, big_v, "high", calibration=cal, backend=cuda) == blob
        got = codec.decode(blob, backend=cuda, calibrations={cal.id: cal})
        want = codec.decode(blob, backend=cpu, calibrations={cal.id: cal})
        for g, w in zip(got, want):
            assert np.array_equal(g.view(np.uint16), w.view(np.uint16)), ("calibrated", block)
    # A corrupt stream word under a valid checksum: both backends must agree on what it
    # gives, the same refusal or the same values, never garbage of their own.
    bad = bytearray(codec.encode(keys, values, "balanced", backend=cpu))
    bad[-40] ^= 0xFF  # a stream word
    from codec_helpers import refresh_crc
    bad = refresh_crc(bad)

    def outcome(b):
        try:
            return tuple(a.view(np.uint16).tobytes() for a in codec.decode(bad, backend=b))
        except codec.CodecError as e:
            return ("refused", str(e))

    got, want = outcome(cuda), outcome(cpu)
    assert got == want, (got[:1], want[:1])
    print("cuda-sim ok", "refused" if want[0] == "refused" else "decoded")
""")


def test_cuda_simulator_codes_bit_identically():
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "KVDESK_CODEC_BACKEND": ""}
    here = Path(__file__).parent
    env["PYTHONPATH"] = os.pathsep.join([str(here), str(here.parent), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "cuda-sim ok" in run.stdout


def test_no_cuda_driver_means_the_cpu_backend_without_importing_numba_cuda():
    """Every process chooses its backend at its first codec call: on a machine with no CUDA
    driver that must not cost the import of numba.cuda."""
    code = ("import sys; from codec import backend; name = backend.active().name; "
            "print(name, 'numba.cuda' in sys.modules)")
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_ENABLE_CUDASIM", "KVDESK_CODEC_BACKEND", "NUMBA_CUDA_DRIVER")}
    env["NUMBA_CUDA_DRIVER"] = "/nonexistent/libcuda.so"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).parent.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["cpu", "False"]
