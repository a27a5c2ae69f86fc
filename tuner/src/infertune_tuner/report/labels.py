"""Where each point's label goes on a plot: beside its point, on nothing else (pure geometry).

Greedy and deterministic: labels are placed one by one, the most important first (the order
the caller gives), each at the first free spot of a fixed list of candidates around its point
(8 directions at growing distances; a far one gets a leader line). A spot is free when its box
stays inside the plot area and meets no marker and no label placed before it. Only when no
candidate is free does a label take the spot that overlaps least.

Why not a force-directed placer (adjustText): on a 40-trial study it still left overlaps after
600 iterations and took 3-15 s per plot; this places the same labels without an overlap in a
fraction of a second, and the same report always gets the same picture. A candidate's overlap
with everything placed is one vectorised sum, so a plot of a thousand markers still places its
labels in well under a second (the caller labels at most plot.MAX_LABELS points).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Distances (display pixels) from the point to the nearest corner or edge of its label.
RADII = (4.0, 10.0, 18.0, 28.0, 40.0, 55.0, 72.0, 92.0, 115.0, 140.0, 170.0)
# Directions, in the order preferred: right and up first (labels read from the point).
DIRECTIONS = ((1, 1), (1, 0), (1, -1), (0, 1), (-1, 1), (-1, 0), (-1, -1), (0, -1))
LEADER_FROM = 12.0  # a label this far from its point gets a leader line


@dataclass(frozen=True)
class Box:
    x0: float
    y0: float
    x1: float
    y1: float

    def overlap(self, other: Box) -> float:
        """The area both boxes cover (0 when they only touch)."""
        w = min(self.x1, other.x1) - max(self.x0, other.x0)
        h = min(self.y1, other.y1) - max(self.y0, other.y0)
        return w * h if w > 0 and h > 0 else 0.0

    def inside(self, bounds: Box) -> bool:
        return (
            self.x0 >= bounds.x0
            and self.y0 >= bounds.y0
            and self.x1 <= bounds.x1
            and self.y1 <= bounds.y1
        )


@dataclass(frozen=True)
class Placed:
    box: Box
    leader: bool  # far enough from its point to need a line to it


def _candidate(x: float, y: float, w: float, h: float, r: float, d: tuple[int, int]) -> Box:
    dx, dy = d
    # The label's corner (or edge middle) nearest the point sits r away in direction d.
    x0 = x + r if dx > 0 else x - r - w if dx < 0 else x - w / 2
    y0 = y + r if dy > 0 else y - r - h if dy < 0 else y - h / 2
    return Box(x0, y0, x0 + w, y0 + h)


def place(
    anchors: list[tuple[float, float]],
    sizes: list[tuple[float, float]],
    obstacles: list[Box],
    bounds: Box,
) -> list[Placed]:
    """One box per label (same order as `anchors`), each at the first free candidate spot.

    Args:
        anchors: Each label's point (display coordinates, y up).
        sizes: Each label's width and height.
        obstacles: What no label may cover (the markers, the chosen configuration's ring).
        bounds: The plot area every label stays inside.
    """
    # Every box placed so far (obstacles first), one row each: x0, y0, x1, y1.
    taken = np.zeros((len(obstacles) + len(anchors), 4))
    for i, o in enumerate(obstacles):
        taken[i] = (o.x0, o.y0, o.x1, o.y1)
    n = len(obstacles)
    out: list[Placed] = []
    for (x, y), (w, h) in zip(anchors, sizes, strict=True):
        best: tuple[float, Box, float] | None = None
        rows = taken[:n]
        for r in RADII:
            for d in DIRECTIONS:
                box = _candidate(x, y, w, h, r, d)
                if not box.inside(bounds):
                    continue
                cost = _overlap(box, rows)
                if best is None or cost < best[0]:
                    best = (cost, box, r)
                if cost == 0:
                    break
            if best is not None and best[0] == 0:
                break
        if best is None:  # nothing fits inside the plot area: beside the point, as it comes
            box = _candidate(x, y, w, h, RADII[0], DIRECTIONS[0])
            best = (0.0, box, RADII[0])
        out.append(Placed(best[1], best[2] >= LEADER_FROM))
        b = best[1]
        taken[n] = (b.x0, b.y0, b.x1, b.y1)
        n += 1
    return out


def _overlap(box: Box, rows: np.ndarray) -> float:
    """The area `box` shares with all of `rows` together (Box.overlap, summed)."""
    if not len(rows):
        return 0.0
    w = np.minimum(box.x1, rows[:, 2]) - np.maximum(box.x0, rows[:, 0])
    h = np.minimum(box.y1, rows[:, 3]) - np.maximum(box.y0, rows[:, 1])
    return float(np.sum(np.where((w > 0) & (h > 0), w * h, 0.0)))
