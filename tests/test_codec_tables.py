"""The codec's tables kept for reuse, and their release."""

from __future__ import annotations


def test_released_tables_are_built_again_and_decode_the_same():
    """A calibration's search drops the tables of the configs it tried (codec.release_tables):
    nothing is kept, and a blob decodes the same with tables built anew."""
    from codec_helpers import random_kv

    import codec
    from codec import plan
    from codec.kernels import tables

    keys, values = random_kv((2, 40, 64))
    blob = codec.encode(keys, values, "balanced")
    before = codec.decode(blob)
    assert plan.Plan.of.cache_info().currsize and tables.kind_bank.cache_info().currsize
    codec.release_tables()
    assert plan.Plan.of.cache_info().currsize == 0
    assert tables.kind_bank.cache_info().currsize == 0
    after = codec.decode(blob)
    assert all((a == b).all() for a, b in zip(before, after, strict=True))
