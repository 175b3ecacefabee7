"""Derivative rules: one entry per Taichi op (``forward``, ``reverse``), the ``@ti.func`` helpers the
generated code calls (``helpers``, ``cofactors``, ``decompositions``), and what a call goes to beyond
the ops (``calls``: user rules, tidiff Functions)."""
