"""BLAS on one thread around the server's many small solves, restored after.

The server's linear algebra on a reply's arrival is small (a block's decodability, a probe's
product, at most ``n x k``); OpenBLAS's threads on cores that other jobs keep busy make each
call wait for them. :func:`serial_blas` runs the block single-threaded; nested blocks are free,
so the grid enters one around a batch of pulled replies and each reply's validation its own.
"""

from __future__ import annotations

import functools
from contextlib import AbstractContextManager
from typing import Any

from threadpoolctl import ThreadpoolController

__all__ = ["serial_blas"]


@functools.cache
def _blas() -> list[Any]:
    """The BLAS libraries loaded by then (numpy's, scipy's)."""
    return list(ThreadpoolController().select(user_api="blas").lib_controllers)


class _SerialBlas(AbstractContextManager):
    """One BLAS thread inside the block; only libraries on more threads are changed, and
    restored on exit (a few microseconds where threadpoolctl's ``limit`` takes 50). Nested
    blocks cost nothing: only the outermost one changes and restores (the grid enters one
    around a batch of replies, each reply's validation enters its own inside it)."""

    depth = 0  # blocks entered and not yet left, in this process

    def __enter__(self) -> _SerialBlas:
        self._restore = []
        _SerialBlas.depth += 1
        if _SerialBlas.depth > 1:
            return self
        try:
            for lib in _blas():
                threads = lib.get_num_threads()
                if threads != 1:
                    lib.set_num_threads(1)
                    self._restore.append((lib, threads))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        _SerialBlas.depth -= 1
        for lib, threads in reversed(self._restore):
            lib.set_num_threads(threads)


def serial_blas() -> AbstractContextManager:
    """BLAS and LAPACK on one thread inside the block (restored after it).

    The server's linear algebra is many small solves (a block's decodability, the sparse
    decoding's QR, the cross-check's SVD, at most ``n x k``): with OpenBLAS's default threads
    on cores other jobs keep busy, each call waits for its threads; a 100 x 100 SVD was
    measured at 0.9 s instead of 1 ms. Single-threaded, they cost what their size says.
    """
    return _SerialBlas()
