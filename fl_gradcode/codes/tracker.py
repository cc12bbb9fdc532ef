"""Exact decodability of a growing set of replies, as they arrive one at a time.

A set ``F`` of replies decodes exactly when some ``a`` has ``a @ B[F] == 1`` (Tandon, Lei,
Dimakis, Karampatziakis, "Gradient Coding", ICML 2017, https://arxiv.org/abs/1612.03301).
Three necessary conditions are checked before any solve, cheapest first:

* **coverage**: every partition of a block is held by some received row (a partition nobody
  received has ``(a @ B[F])_j = 0``, never 1): a counter per partition, no linear algebra;
* **span**: the ones vector must lie in the span of the received rows
  (:class:`~fl_gradcode.codes.span.RowSpan`: built at once when a one-block code is first
  covered, or when a covered block's own small solve has failed; then updated per row);
* then the code's own test decides (a block's solve, cached per received subset, or the
  code's closed-form ``is_decodable`` for one-block codes).

A CRC round builds its basis once its replies cover every partition (one QR, then a row at a
time) and solves once; an FRC-shaped group solves once, an RS-like block of threshold ``t``
about twice instead of ``t`` times.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .span import RowSpan

__all__ = ["DecodabilityTracker"]


class _Block:
    """One block's received rows, its uncovered partitions and (after a failed solve) span."""

    __slots__ = ("cols", "cover", "missing", "rows", "span")

    def __init__(self, parts: tuple[int, ...]) -> None:
        self.cols = list(parts)
        self.cover = dict.fromkeys(parts, 0)  # partition -> received rows holding it
        self.missing = len(parts)
        self.rows: list[int] = []
        self.span: RowSpan | None = None

    def add(self, worker: int, support: tuple[int, ...]) -> None:
        self.rows.append(worker)
        cover = self.cover
        for j in support:
            if cover[j] == 0:
                self.missing -= 1
            cover[j] += 1


class DecodabilityTracker:
    """Exact decodability of a growing set of replies, one block re-checked per new reply.

    :meth:`GradientCode.is_decodable` solves the whole received set; a server that asks after
    every reply would pay ``O(n)`` solves per reply. Exactness decomposes over the code's
    independent blocks (the groups of FRC-like codes), so a new reply only re-checks its own
    block (see the module docstring for the checks that come before a solve); the set decodes
    once every block does. Codes with one block ask the code's own (closed-form or fast) test
    on the whole set; codes without blockwise exactness (replies that are not rows of ``B``,
    chunked replies) ask it after every reply once each of their
    :meth:`~fl_gradcode.codes.base.GradientCode.necessary_counts` is met.
    """

    def __init__(self, code: Any) -> None:
        self.code = code
        self.received: set[int] = set()
        blocks = code.blocks
        self._blockwise = code.blockwise_exactness and len(blocks) > 1
        # one block (the whole code) where a decoding is one vector with a @ B[F] == 1
        self._whole = (not self._blockwise and code.blockwise_exactness and code.chunks == 1)
        if self._whole:
            self._blocks = [_Block(tuple(range(code.k)))]
        else:
            self._blocks = [_Block(parts) for _, parts in blocks]
        self._orphans = sum(len(parts) for _, parts in blocks) < code.k
        # codes asked after every reply: groups still short of the replies they need
        self._left: list[int] = []
        self._groups_of: dict[int, list[int]] = {}
        if not (self._blockwise or self._whole):
            for g, (clients, count) in enumerate(code.necessary_counts()):
                self._left.append(int(count))
                for c in clients:
                    self._groups_of.setdefault(int(c), []).append(g)
        self._short = sum(1 for left in self._left if left > 0)
        self._pending = set(range(len(blocks)))
        self._decodable = False

    def add(self, worker: int) -> bool:
        """Record ``worker``'s reply; return whether the replies so far decode exactly."""
        code = self.code
        b = code.block_of(worker)  # checks the index
        worker = int(worker)
        if worker in self.received:
            return self._decodable
        self.received.add(worker)
        if not (self._blockwise or self._whole):
            for g in self._groups_of.get(worker, ()):
                self._left[g] -= 1
                if self._left[g] == 0:
                    self._short -= 1
            self._decodable = not self._short and code.is_decodable(sorted(self.received))
            return self._decodable
        if self._whole:
            self._decodable = self._check(self._blocks[0], worker, 0)
            return self._decodable
        if self._orphans:  # a partition nobody holds never decodes
            return False
        if b < 0:  # a client holding nothing changes nothing
            return self._decodable
        if b in self._pending and self._check(self._blocks[b], worker, b):
            self._pending.discard(b)
        self._decodable = not self._pending
        return self._decodable

    def _check(self, block: _Block, worker: int, b: int) -> bool:
        """Whether ``block`` decodes with ``worker``'s row added (coverage, span, solve)."""
        block.add(worker, self.code.assignment(worker))
        if block.missing:
            return False
        if block.span is not None:
            block.span.add(self._row(block, worker))
        elif self._whole:  # first time covered: the rows' span at once (a failing solve of
            # the whole code costs far more than one QR)
            block.span = RowSpan(len(block.cols))
            block.span.add_rows(self.code.B[block.rows])
        elif self._solve(block, b):  # a block first covered: its solve (small), then a span
            return True
        else:
            block.span = RowSpan(len(block.cols))
            block.span.add_rows(self.code.B[np.ix_(block.rows, block.cols)])
            return False
        return block.span.may_decode and self._solve(block, b)

    def _row(self, block: _Block, worker: int) -> np.ndarray:
        row = self.code.B[worker]
        return row if self._whole else row[block.cols]

    def _solve(self, block: _Block, b: int) -> bool:
        if self._whole:
            return bool(self.code.is_decodable(sorted(self.received)))
        return bool(self.code.block_decodes(b, frozenset(block.rows)))

    @property
    def decodable(self) -> bool:
        """Whether the replies recorded so far decode exactly."""
        return self._decodable

    @property
    def pending_blocks(self) -> set[int]:
        """Blocks that do not decode yet (every block when exactness is not blockwise and the
        set does not decode; none once it does)."""
        if self._decodable:
            return set()
        if not self._blockwise:
            return set(range(len(self.code.blocks)))
        return set(self._pending)
