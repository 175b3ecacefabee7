"""Derivative rules: the rule table (``table``: how an entry is written and looked up; ``ops``: one entry
per Taichi op, both modes), the ``@ti.func`` helpers the generated code calls (``helpers``, ``cofactors``,
``decompositions``), and what a call goes to (``calls``: classify, user rules, tidiff Functions).

Importing the package fills the table: every module that reads it imports it from here."""
from . import ops as ops
