"""Time a span spends in no child span: the part of a span with children that none of them covers.

A breakdown ranks spans by their own time, but a parent's own time is easy to misread as bookkeeping; when
children cover most of a span and a large share is still its own, that share is code between the children
that no span names (a sleep, a sort, a sync). code_range finds where that code is: the `with span(NAME)`
blocks in a source folder.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from infragent.analysis.breakdown import exclusive, parents
from infragent.analysis.trace_columns import TraceColumns

SELF_SHARE = 0.08  # of busy time: a parent's own time worth a finding


@dataclass
class SelfTime:
    """A span with children whose own time is a large share of busy time."""

    span: str
    self_ns: int
    inclusive_ns: int
    share: float  # own time / busy time
    children: list[str]  # its children's names, most time first


def self_time(c: TraceColumns, mask: np.ndarray | None = None, min_share: float = SELF_SHARE) -> list[SelfTime]:
    """Spans that have children and hold at least min_share of busy time themselves, largest first."""
    parent = parents(c)
    own = exclusive(c, parent)
    mask = np.ones(len(c), bool) if mask is None else mask
    total = float(own[mask].sum()) or 1.0
    n = len(c.names)
    mine = np.bincount(c.name[mask], weights=own[mask], minlength=n)
    nested = (parent >= 0) & mask
    parent_name = c.name[parent[nested]]
    has_children = np.bincount(parent_name, minlength=n) > 0
    found = []
    for k in np.flatnonzero(has_children & (mine / total >= min_share)):
        rows = (c.name == k) & mask
        kids = nested.copy()
        kids[nested] = parent_name == k
        by_child = np.bincount(c.name[kids], weights=(c.end - c.start)[kids], minlength=n)
        found.append(SelfTime(c.names[k], int(mine[k]), int((c.end - c.start)[rows].sum()), float(mine[k] / total),
                              [c.names[j] for j in np.argsort(-by_child, kind="stable") if by_child[j] > 0]))
    return sorted(found, key=lambda s: -s.self_ns)


def code_range(span: str, folder: Path) -> list[str]:
    """'path:first-last' of each `with span(NAME ...)` block under folder (Python sources), for a finding."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        if f'span("{span}"' not in text and f"span('{span}'" not in text:
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.With, ast.AsyncWith)) and any(_names_span(item.context_expr, span)
                                                                    for item in node.items):
                found.append(f"{path.relative_to(folder).as_posix()}:{node.lineno}-{node.end_lineno}")
    return found


def _names_span(expr: ast.expr, span: str) -> bool:
    return (isinstance(expr, ast.Call) and bool(expr.args) and isinstance(expr.args[0], ast.Constant)
            and expr.args[0].value == span
            and ((isinstance(expr.func, ast.Name) and expr.func.id == "span")
                 or (isinstance(expr.func, ast.Attribute) and expr.func.attr == "span")))
