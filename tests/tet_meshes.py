"""Random tet meshes for the element-sum tests: connectivity, a deformed state, rest-shape inverses and volumes."""
import numpy as np


def tet_mesh(seed, nodes=14, count=12, stretch=(1.0, 1.0, 1.0), noise=0.05):
    """Random tets on ``nodes`` points (rest shape X), a deformed state x (X stretched by ``stretch``, plus
    ``noise``), rest-shape inverses B and volumes."""
    rng = np.random.default_rng(seed)
    tets = np.array([rng.choice(nodes, 4, replace=False) for _ in range(count)])
    X = rng.standard_normal((nodes, 3))
    B = np.stack([np.linalg.inv(np.stack([X[t[1]] - X[t[0]], X[t[2]] - X[t[0]], X[t[3]] - X[t[0]]], 1))
                  for t in tets])
    vol = rng.uniform(0.5, 1.0, count)
    x = X @ np.diag(stretch) + noise * rng.standard_normal((nodes, 3))
    return tets, x, B, vol
