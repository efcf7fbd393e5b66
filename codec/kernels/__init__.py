"""The kernels room: the numba CPU kernels of the format and the frozen tables they share.

    quant       scales, symbols and table choice (fp16 bit patterns in, symbols out)
    rans        the rANS entropy coder: encode, and decode fused with dequantization
    tkernel     the inverse transform, operation for operation as `calibrated.transform`
    tables      the codebook of symbol probability tables and the decoder's lookup tables
    workspace   per-thread scratch arrays reused from chunk to chunk

Its question is "how are these numbers coded fast?": arrays in, arrays out, every byte pinned
by `backend.reference`. It imports nothing else of the package: never the blob format, the
levels, calibrations, a backend or the pipeline (they hand it plain arrays and integers), and
no kernel may be defined before `jit` has configured numba (`codec/__init__.py` sees to it).
"""
