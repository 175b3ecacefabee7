"""Output structures: a leaf is an index into a flat list; a node is a tuple.

Generated bodies return flat tuples (Taichi cannot unpack nested ones); the
tree puts results back into the nested tuples JAX users expect.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

Tree = int | tuple["Tree", ...]


def unflatten(tree: Tree, flat: Sequence[Any]) -> Any:
    """Nested tuples of ``flat``'s entries, shaped like ``tree``."""
    if isinstance(tree, tuple):
        return tuple(unflatten(t, flat) for t in tree)
    return flat[tree]


def leaves(tree: Tree) -> list[int]:
    """The leaf indices of ``tree`` in order."""
    if isinstance(tree, tuple):
        return [i for t in tree for i in leaves(t)]
    return [tree]


def flat_tree(n: int, single: bool) -> Tree:
    """The tree of ``n`` flat outputs: one leaf, or a tuple of leaves."""
    return 0 if single else tuple(range(n))


def flatten_like(tree: Tree, value: Any, call: str, what: str = "the cotangent") -> Iterator[Any]:
    """The entries of ``value`` in the order of ``tree``'s leaves; refuses a value of another structure."""
    if isinstance(tree, tuple):
        if not isinstance(value, (tuple, list)) or len(value) != len(tree):
            raise TypeError(f"{call}: {what} must be a tuple of {len(tree)} entries, like the outputs")
        for t, v in zip(tree, value, strict=True):
            yield from flatten_like(t, v, call, what)
    else:
        yield value
