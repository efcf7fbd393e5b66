"""The calibrated room: a model's calibration and the transforms its calibrated levels code
through.

    calibration `Calibration`: per KV part, the keys' and values' transforms and the levels
                calibrated for them, as immutable bytes identified by their SHA-256
    transform   `KindTransform`: RoPE removed, centred, a per-head or layer-wide basis; `fit`
                on KV, and `inverse`, the definition the kernels' inverse repeats
    intinverse  an exact transform's inverse in integer sums (BLAS, order-free)

Its question is "what does this model's KV look like?". It stands on `format` (a calibration
holds level configs) and `errors`; it never imports numba, the kernels, a backend or the
pipeline: the numba twin of `transform.inverse` is `kernels.tkernel`.
"""
