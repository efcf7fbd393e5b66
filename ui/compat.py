"""A workaround for PySide6 6.12 on Python 3.11, applied once when `ui` is imported.

PySide6 6.12's bindings release a reference to None (and to True/False) that they never took,
on most calls of a method returning void or bool: `setHtml`, `setEnabled`, the static
`QApplication.processEvents`... Python 3.12+ made these objects immortal, so there it is
harmless; on 3.11 their reference counts run down and after a few thousand calls the
interpreter aborts ("Fatal Python error: none_dealloc"). Giving the three singletons a huge
reference count makes them as immortal as 3.12 does. On 3.12+ this module does nothing.

It never touches any other object. Remove it once PySide6 is fixed or Python >= 3.12 is required.
"""

from __future__ import annotations

import ctypes
import sys

# ob_refcnt is a PyObject's first field in release builds; 2**40 releases take years of calls.
IMMORTAL_MARGIN = 1 << 40


def make_singletons_immortal() -> None:
    if sys.version_info >= (3, 12):
        return
    for obj in (None, True, False):
        refcnt = ctypes.c_ssize_t.from_address(id(obj))
        if refcnt.value < IMMORTAL_MARGIN:
            refcnt.value += IMMORTAL_MARGIN


make_singletons_immortal()
