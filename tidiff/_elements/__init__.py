"""Element sums and element maps over a mesh, and their sparse derivatives (docs/sparse.md)."""
