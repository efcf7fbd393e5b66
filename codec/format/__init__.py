"""The format room: the blob container and the level configs a blob carries.

    container   the blob's bytes: prelude, JSON header, aligned payload sections, CRC-32
    levels      `CodecConfig` and `KindConfig`: what a level is, and its JSON form
    level_table the named levels, as plain data

Its question is "what does a blob say it is?": it validates and describes, and codes
nothing. It stands on `errors` alone; it never imports the kernels, calibrations, a backend
or the pipeline, and never numba.
"""
