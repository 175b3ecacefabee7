"""A small fixed library of ``td.custom_jvp`` / ``td.custom_vjp`` functions, each with a correct rule and a torch twin.

Generated programs call these by name (``lib_`` + the name in
``tests/custom_functions.py``, which defines them for every test that calls
them). Each rule is correct but computed by a different formula than the
primal's own derivative would be (the rule, not a transform of the primal,
must be what runs); the torch twin is the plain function, whose autograd
derivative the rule must match.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from custom_functions import energy as lib_energy
from custom_functions import energy_twin, softsign_twin, squash_twin, swirl_twin
from custom_functions import softsign as lib_softsign
from custom_functions import squash as lib_squash
from custom_functions import swirl as lib_swirl


@dataclass(frozen=True)
class Entry:
    """One library function: its Taichi Function, its torch twin, and its signature."""

    func: Any
    twin: Callable
    param_shapes: tuple
    out_shape: tuple
    forward: bool  # has a jvp rule (a custom_vjp without one refuses forward mode, as in JAX)
    smooth: bool = True


LIBRARY: dict[str, Entry] = {
    "lib_softsign": Entry(lib_softsign, softsign_twin, ((),), (), forward=True),
    "lib_swirl": Entry(lib_swirl, swirl_twin, ((3,), ()), (3,), forward=True),
    "lib_energy": Entry(lib_energy, energy_twin, ((2,), ()), (), forward=False),
    "lib_squash": Entry(lib_squash, squash_twin, ((2, 2), (2,)), (2,), forward=True),
}
"""name -> Entry; programs call ``name(...)`` in Taichi and in the torch twin."""
