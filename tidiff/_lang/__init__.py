"""The language layer both source transforms stand on: a function's source parsed and prepared
(``parse``, ``source``, ``comprehensions``, ``returns``, ``objects``, ``callees``), names (``naming``),
AST builders (``nodes``, ``sym``), activity (``activity``), renaming for Taichi's optimizer
(``rebinding``) and compiling generated source (``compile``). It knows no derivative rule."""
