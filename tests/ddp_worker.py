"""Training with a tidiff operator, in one process or in DistributedDataParallel ranks (test_torch_distributed).

    python tests/ddp_worker.py OUT_DIR    # two gloo ranks; rank 0 saves its parameters to OUT_DIR/ddp.pt
"""
import os
import sys

import taichi as ti
import torch

import tidiff as td

STEPS, BATCH = 5, 8


@ti.func
def energy(x: ti.math.vec3, s: ti.f64) -> ti.f64:
    return s * x.dot(x) + ti.sin(x[0]) * ti.exp(s * x[1])


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.lin = torch.nn.Linear(4, 3, dtype=torch.float64)
        with torch.no_grad():
            self.lin.weight.copy_(0.5 * torch.randn(3, 4, dtype=torch.float64, generator=g))
            self.lin.bias.zero_()
        self.s = torch.nn.Parameter(torch.tensor(0.3, dtype=torch.float64))
        self.op = td.torch.function(energy)

    def forward(self, x):
        return self.op(torch.tanh(self.lin(x)), self.s)


def data():
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(STEPS, BATCH, 4, dtype=torch.float64, generator=g)
    return xs, torch.randn(STEPS, BATCH, dtype=torch.float64, generator=g)


def train(model, rank=0, world=1):
    """SGD on the mean squared error; each rank takes its contiguous share of every batch."""
    xs, ys = data()
    share = BATCH // world
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in zip(xs, ys, strict=True):
        x, y = x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
    return model


def rank_main(rank, world, out_dir):
    # each rank its own offline cache: two processes writing one cache at exit can abort (SIGABRT, seen in CI)
    ti.init(arch=ti.cpu, default_fp=ti.f64, offline_cache=True, log_level=ti.WARN,
            offline_cache_file_path=os.path.join(out_dir, f"ticache-{rank}"))
    torch.distributed.init_process_group("gloo", init_method=f"file://{out_dir}/rendezvous", rank=rank,
                                         world_size=world)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(Model())
        train(ddp, rank, world)
        if rank == 0:
            torch.save({k: v.detach() for k, v in ddp.module.state_dict().items()}, os.path.join(out_dir, "ddp.pt"))
        torch.distributed.barrier()  # no rank leaves while another still talks to it
    finally:
        torch.distributed.destroy_process_group()
        ti.reset()  # Taichi's runtime ends before the process does (a rank aborted at exit without it)


if __name__ == "__main__":
    torch.multiprocessing.spawn(rank_main, args=(2, sys.argv[1]), nprocs=2, join=True)
