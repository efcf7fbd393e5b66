"""The jit room: where the codec's compiled kernels come from, and for which CPU.

    jitcache     configures numba as it is imported (before any kernel is defined): the
                 checkout's cache, or a verified cache shipped with a bundle; the stamp of a
                 fully compiled cache
    cachelocator numba's cache locator for the codec's kernels, imported by numba by name
                 (`codec.jit.cachelocator.CodecCacheLocator`)

Importing this package imports neither of them. It never imports anything else of the
codec (it knows kernels only by their files) and never makes numba compile or load a kernel
at import; it must never change what a kernel computes.
"""
