"""The one exception the codec raises for bad input or bad blobs.

Everything the codec refuses (corrupt, truncated or foreign blobs, non-finite input, wrong
shapes, unknown levels) surfaces as `CodecError`, so callers need a single except clause.
This module must never import anything else from the package.
"""


class CodecError(ValueError):
    """Input the codec cannot accept, or a blob it cannot decode faithfully."""
