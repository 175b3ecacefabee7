"""Output structures: a leaf is an index into a flat list; a node is a tuple.

Generated bodies return flat tuples (Taichi cannot unpack nested ones); the
tree puts results back into the nested tuples JAX users expect.
"""


def unflatten(tree, flat):
    """Nested tuples of ``flat``'s entries, shaped like ``tree``."""
    if isinstance(tree, tuple):
        return tuple(unflatten(t, flat) for t in tree)
    return flat[tree]


def leaves(tree):
    """The leaf indices of ``tree`` in order."""
    if isinstance(tree, tuple):
        return [i for t in tree for i in leaves(t)]
    return [tree]


def flat_tree(n, single):
    """The tree of ``n`` flat outputs: one leaf, or a tuple of leaves."""
    return 0 if single else tuple(range(n))
