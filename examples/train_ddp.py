"""A PyTorch data-parallel training run that survives node failures, bit for bit.

One process (rank) per node, launched by ``srun`` (examples/train_ddp.sbatch) or by hand
with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT. ``torch.distributed`` on the gloo
backend, CPU only: a small MLP (about 2 MB of parameters, Adam) learns a fixed random
teacher network from synthetic batches made from (seed, step, rank), so a resumed run
sees exactly the batches an uninterrupted one would.

Checkpoints go through ``hyperpod_agent.checkpoint``: every step to the memory tier
(asynchronously, with a replica on the next node when peers are configured), every
``--persistent-every`` steps to the persistent tier. On start every rank restores the
newest step complete for all ranks: from its own memory tier, else from a peer's replica
of it (a rank on a new node), else from the persistent tier; the ranks then agree on one
step. Progress goes through ``hyperpod_agent.progress``: every step with the rank's
compute time (the controller names a straggler by it), evaluation in a paused phase
(checkpoint saves and loads pause through the library).

Determinism: a run interrupted and resumed ends with the same parameters, bit for bit,
as one that was not, and computes the same loss at every step: deterministic kernels on
a fixed number of threads, batches from the step number, one all-reduce of one flat
buffer in a fixed order (gloo's sum of two ranks is commutative, hence exact; with more
ranks it is deterministic for a fixed world size), and a bit-exact checkpoint of the
model and the optimizer.

Environment: RANK/WORLD_SIZE/LOCAL_RANK (torchrun), else SLURM_PROCID/SLURM_NTASKS/
SLURM_LOCALID. The rendezvous host is HYPERPOD_RDZV_HOST (set by ``hyperpod step-retry``
on every launch of an ``srun --auto-resume`` step: the first node of the job as it is
then), else MASTER_ADDR, else the first node of SLURM_STEP_NODELIST or
SLURM_JOB_NODELIST; the port is MASTER_PORT, else 29500. The checkpoint library reads
HYPERPOD_CHECKPOINT_* (docs/checkpoint.md); ``--peer-port`` builds
HYPERPOD_CHECKPOINT_PEERS from the step's nodes when it is not set.

Lines printed by rank 0 (the same as examples/train_toy.py's, which the drills parse):
    resume step=<N> ... at=<epoch>     or    fresh start at=<epoch>
    step=<N> loss=<x> at=<epoch>
    done step=<N> at=<epoch>
    params sha256=<hex>
and by every rank: ``rank=<R> restored step=<N> tier=<tier> source=<where>``.

Files rank 0 writes under ``--out``: ``losses.txt`` (appended; one line per step:
``<step> <loss as float.hex()>``, the same step again after a resume), and at the end
``params.sha256`` and ``final.pt`` (the model's state_dict).

Exit codes:
    0    done
    1    failed; a relaunch may get further (a peer died, a collective timed out, I/O)
    2    bad arguments
    93   do not restart: the same failure would come back on any nodes (a loss that is
         not finite: data and seed are fixed; a checkpoint that does not fit this model,
         or that belongs to another job; a bad checkpoint setting). The controller neither
         retries nor requeues a step or job that ends with 93 (docs/auto-resume.md).
    130  stopped cleanly on SIGINT, after the step under way was saved and made durable;
         not retried nor requeued either. SIGTERM (what the step-retry helper sends a
         step the controller ends) is left to its default: a retry follows.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import math
import os
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

# Run as a script, its own directory is on sys.path: the launch helpers sit beside it.
from ddp_launch import checkpoint_env, int_env, node_address, rendezvous_host  # noqa: E402
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from hyperpod_agent import progress
from hyperpod_agent.checkpoint import Checkpointer
from hyperpod_agent.checkpoint.errors import (
    CheckpointConfigError,
    TemplateMismatchError,
    UnsupportedStateError,
)
from hyperpod_agent.checkpoint.identity import OtherJobError

EXIT_FAILED, EXIT_DO_NOT_RESTART, EXIT_STOPPED = 1, 93, 130
DIM_IN, DIM_OUT, BATCH = 64, 16, 64


class DoNotRestart(Exception):
    """A failure a relaunch on other nodes would meet again."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden", type=int, default=512, help="width of the MLP's hidden layers")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument(
        "--persistent-every",
        "--ckpt-every",
        type=int,
        default=10,
        metavar="K",
        help="write the persistent tier every K steps (the memory tier: every step)",
    )
    p.add_argument(
        "--eval-every",
        type=int,
        default=20,
        metavar="E",
        help="evaluate (in a paused phase) every E steps; 0: never",
    )
    p.add_argument(
        "--step-time",
        type=float,
        default=0.0,
        metavar="S",
        help="extra compute per step, as a larger model would spend (sleep)",
    )
    p.add_argument(
        "--burn",
        action="store_true",
        help="spend --step-time on the CPU (a busy loop) instead of sleeping, so a rank "
        "slowed from outside (a CPU quota, stop/continue) computes more slowly, as a slow "
        "GPU would",
    )
    p.add_argument("--slow-rank", type=int, metavar="R", help="straggler drill: this rank...")
    p.add_argument(
        "--slow-factor", type=float, default=1.0, metavar="F", help="...spends F times --step-time"
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        metavar="S",
        help="rendezvous and collective timeout",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path(os.environ.get("TRAIN_DDP_OUT", ".")),
        help="where rank 0 writes losses.txt, params.sha256 and final.pt",
    )
    p.add_argument(
        "--peer-port",
        type=int,
        metavar="P",
        help="without HYPERPOD_CHECKPOINT_PEERS: replica servers on port P of "
        "every node of the step (P + its index with --peer-host)",
    )
    p.add_argument(
        "--peer-host",
        metavar="H",
        help="every node's replica server is at H (a cluster on one machine)",
    )
    p.add_argument(
        "--memory-per-node",
        type=Path,
        metavar="DIR",
        help="memory tier in DIR/<node> (a cluster on one machine, whose nodes share /dev/shm)",
    )
    p.add_argument(
        "--crash-after",
        type=int,
        metavar="K",
        help="drill: once step K is handed to the checkpoint library, exit 1 at "
        "once, as a node that dies (nothing waited for)",
    )
    args = p.parse_args(argv)
    if args.steps < 1 or args.persistent_every < 1 or args.eval_every < 0 or args.threads < 1:
        p.error("--steps, --persistent-every, --threads must be >= 1, --eval-every >= 0")
    if args.step_time < 0 or args.slow_factor <= 0 or args.timeout <= 0:
        p.error("--step-time must be >= 0, --slow-factor and --timeout > 0")
    return args


# -- model and data ---------------------------------------------------------------------
def make_model(hidden: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(DIM_IN, hidden),
        nn.GELU(),
        nn.Linear(hidden, hidden),
        nn.GELU(),
        nn.Linear(hidden, hidden),
        nn.GELU(),
        nn.Linear(hidden, DIM_OUT),
    )


def generator(*key: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(int.from_bytes(hashlib.sha256(repr(key).encode()).digest()[:8], "little"))
    return g


class Data:
    """Batches of a fixed random teacher: the same for the same (seed, step, rank)."""

    def __init__(self, seed: int) -> None:
        g = generator(seed, -1)
        self.a = torch.randn(DIM_IN, 32, generator=g) / math.sqrt(DIM_IN)
        self.b = torch.randn(32, DIM_OUT, generator=g) / math.sqrt(32)
        self.seed = seed

    def batch(self, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = generator(self.seed, step, rank)
        x = torch.randn(BATCH, DIM_IN, generator=g)
        noise = 0.01 * torch.randn(BATCH, DIM_OUT, generator=g)
        return x, torch.tanh(x @ self.a) @ self.b + noise


def params_sha256(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(f"{name} {t.dtype} {tuple(t.shape)}\n".encode())
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


# -- the run ------------------------------------------------------------------------------
class Stop:
    """SIGINT: finish the step under way, make its save durable, exit 130."""

    def __init__(self) -> None:
        self.asked = False
        signal.signal(signal.SIGINT, self._ask)

    def _ask(self, _signum: int, _frame: object) -> None:
        self.asked = True


def all_steps_agree(step: int, world: int) -> list[int]:
    t = torch.tensor([step], dtype=torch.int64)
    out = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(out, t)
    return [int(x.item()) for x in out]


def restore(ckpt: Checkpointer, rank: int, world: int, say: Any) -> tuple[int, Any]:
    """(step, state) every rank restored: the newest step complete for all of them, the
    same on every rank (None state: a fresh start)."""
    found = ckpt.load_latest()
    mine, state = (found[0], found[1]) if found is not None else (0, None)
    steps = all_steps_agree(mine, world)
    step = min(steps)
    if step != mine:  # another rank could not reach this step: everyone takes the oldest
        state = ckpt.load(step) if step > 0 else None
    info = ckpt.last_restore
    if state is None:
        print(f"rank={rank} fresh start", flush=True)
    else:
        where = f"tier={info.tier} source={info.source}" if info is not None else "tier=?"
        print(f"rank={rank} restored step={step} {where}", flush=True)
    if step:
        say(f"resume step={step} ranks={','.join(map(str, steps))} "
            f"restarts={os.environ.get('SLURM_RESTART_COUNT', '0')}")  # fmt: skip
    else:
        say("fresh start")
    return step, state


def _burn(seconds: float) -> None:
    """Spin until this thread has had ``seconds`` of CPU: a stopped or throttled rank
    takes longer by exactly the time it did not run."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def train(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    rank = int_env(env, ("RANK", "SLURM_PROCID"), 0)
    world = int_env(env, ("WORLD_SIZE", "SLURM_NTASKS"), 1)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(args.threads)
    stop = Stop()

    def say(text: str) -> None:
        if rank == 0:
            print(f"{text} at={time.time():.3f}", flush=True)

    host = node_address(rendezvous_host(env))
    port = int_env(env, ("MASTER_PORT",), 29500)
    timeout = datetime.timedelta(seconds=args.timeout)
    where = f"[{host}]" if ":" in host else host  # an IPv6 address
    dist.init_process_group(
        "gloo", init_method=f"tcp://{where}:{port}", rank=rank, world_size=world, timeout=timeout
    )
    try:
        ckpt = Checkpointer.from_env(
            checkpoint_env(args, env),
            persistent_every=args.persistent_every,
            replicated=["model", "optim"],  # identical on every rank: split for the disk
        )
    except CheckpointConfigError as exc:
        raise DoNotRestart(str(exc)) from exc
    try:
        return _loop(args, rank, world, ckpt, stop, say)
    finally:
        ckpt.close()
        dist.destroy_process_group()


def _loop(
    args: argparse.Namespace, rank: int, world: int, ckpt: Checkpointer, stop: Stop, say: Any
) -> int:
    model = DistributedDataParallel(make_model(args.hidden))  # broadcasts rank 0's init
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    params = [p for p in model.parameters() if p.requires_grad]
    data = Data(args.seed)
    dist.barrier()  # every node's replica server is up before any rank asks one
    try:
        start, state = restore(ckpt, rank, world, say)
        if state is not None:
            model.module.load_state_dict(state["model"])
            opt.load_state_dict(state["optim"])
    except (TemplateMismatchError, UnsupportedStateError, OtherJobError) as exc:
        raise DoNotRestart(str(exc)) from exc
    except (KeyError, RuntimeError, ValueError) as exc:  # load_state_dict: another model
        raise DoNotRestart(f"the checkpoint does not fit this model: {exc}") from exc
    out = args.out
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
    losses = open(out / "losses.txt", "a") if rank == 0 else None  # noqa: SIM115
    extra = args.step_time * (args.slow_factor if rank == args.slow_rank else 1.0)
    eval_x, eval_y = data.batch(0, -1)  # held out: no training step uses rank -1
    try:
        for step in range(start + 1, args.steps + 1):
            x, y = data.batch(step, rank)
            # Compute is timed apart from the all-reduce: under DDP every rank's step
            # lasts as long as the slowest rank's (the others wait for it in the
            # collective), so only the time each spends computing names a straggler.
            # no_sync() keeps DDP's own bucketed all-reduce out of backward(); the
            # gradients then go in one flat all-reduce of our own, outside the timed
            # sections, in a fixed order (bucket order can change after the first step).
            with progress.section("compute"), model.no_sync():
                opt.zero_grad(set_to_none=False)
                loss = F.mse_loss(model(x), y)
                loss.backward()  # type: ignore[no-untyped-call]
                if extra and args.burn:
                    _burn(extra)
                elif extra:
                    time.sleep(extra)
            grads = [p.grad for p in params if p.grad is not None]
            assert len(grads) == len(params), "every parameter has a gradient"
            flat = torch.cat([g.reshape(-1) for g in grads] + [loss.detach().reshape(1)])
            dist.all_reduce(flat)  # sum
            flat /= world
            offset = 0
            for g in grads:
                n = g.numel()
                g.copy_(flat[offset : offset + n].view_as(g))
                offset += n
            mean_loss = float(flat[-1])
            with progress.section("compute"):
                opt.step()
            progress.step(step)
            if not math.isfinite(mean_loss):
                raise DoNotRestart(f"step {step}: loss {mean_loss}")
            if losses is not None:
                losses.write(f"{step} {mean_loss.hex()}\n")
                losses.flush()
            say(f"step={step} loss={mean_loss:.6f}")
            # The save is a paused phase for its blocking part (the library's): staging
            # the state; the memory, peer and persistent writes run on in the background.
            ckpt.save(step, {"model": model.module.state_dict(), "optim": opt.state_dict(),
                             "step": step})  # fmt: skip
            if step == args.crash_after:
                os._exit(EXIT_FAILED)  # a node dying: no wait, no flush, no goodbye
            if args.eval_every and step % args.eval_every == 0:
                with progress.paused("evaluation"), torch.no_grad():
                    say(f"eval step={step} loss={F.mse_loss(model(eval_x), eval_y).item():.6f}")
            if stop.asked:
                ckpt.wait()
                say(f"stopped step={step} (SIGINT)")
                return EXIT_STOPPED
        ckpt.wait()
    finally:
        if losses is not None:
            losses.close()
    if rank == 0:
        digest = params_sha256(model.module)
        torch.save(model.module.state_dict(), out / "final.pt")
        (out / "params.sha256").write_text(digest + "\n")
        say(f"done step={args.steps}")
        print(f"params sha256={digest}", flush=True)
    dist.barrier()  # keep this rank's replica server up until every rank is done
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return train(args, os.environ)
    except DoNotRestart as exc:
        print(f"train_ddp: do not restart: {exc}", file=sys.stderr, flush=True)
        return EXIT_DO_NOT_RESTART


if __name__ == "__main__":
    sys.exit(main())
