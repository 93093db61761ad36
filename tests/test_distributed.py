"""DDP under torchrun: ranks split each global batch, gradients average to the one-process step, rank 0 writes."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

import pandas as pd
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from posbench.distributed import World, launched, teardown, training_loss
from posbench.errors import PosbenchError

SMOKE = ["experiment=smoke", "encoding=alibi", "device=cpu", "threads=1", "eval_lens=[32,64]"]


def test_batch_slices_are_disjoint_and_cover_the_global_batch():
    slices = [World(rank=r, size=4).batch_slice(8) for r in range(4)]
    assert slices == [slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 8)]
    assert World().batch_slice(8) == slice(0, 8)


def test_batch_that_does_not_divide_among_ranks_is_one_line_error():
    with pytest.raises(PosbenchError, match="train.batch_size=6 is not divisible by the 4 ranks"):
        World(rank=1, size=4).batch_slice(6)


def test_each_rank_takes_its_local_gpu_and_keeps_an_explicit_device():
    world = World(rank=3, size=4, local_rank=1)
    assert world.device(torch.device("cuda")) == torch.device("cuda", 1)
    assert world.device(torch.device("cuda", 0)) == torch.device("cuda", 0)
    assert world.device(torch.device("cpu")) == torch.device("cpu")


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, False),
        ({"WORLD_SIZE": "1"}, False),
        ({"WORLD_SIZE": "2"}, True),  # torchrun
        ({"SUBMITIT_EXECUTOR": "slurm", "SLURM_NTASKS": "4"}, True),  # a multi-task SLURM job
        ({"SUBMITIT_EXECUTOR": "slurm", "SLURM_NTASKS": "1"}, False),
        ({"SUBMITIT_EXECUTOR": "local", "SLURM_NTASKS": "4"}, False),
    ],
)
def test_launched_reads_torchrun_and_slurm_variables(monkeypatch, env, expected):
    for key in ("WORLD_SIZE", "SUBMITIT_EXECUTOR", "SLURM_NTASKS"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert launched() is expected


class Bigram(nn.Module):
    """The smallest model with a ``token_nll``: next-token logits from the current token alone."""

    def __init__(self, vocab: int = 11):
        super().__init__()
        self.logits = nn.Embedding(vocab, vocab)

    def token_nll(self, idx, targets):
        return F.cross_entropy(self.logits(idx).flatten(0, 1), targets.flatten(), reduction="none").view_as(targets)


def global_batch():
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, 11, (4, 6), generator=gen), torch.randint(0, 11, (4, 6), generator=gen)  # (B, T) each


def ddp_step(rank: int, size: int, init_file: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=size)
    torch.manual_seed(0)
    model, world = Bigram(), World(rank, size)
    x, y = global_batch()
    rows = world.batch_slice(len(x))
    loss_fn = training_loss(model, world, torch.device("cpu"))  # kept alive: DDP's hooks go with it
    local = loss_fn(x[rows], y[rows]).mean()
    local.backward()
    torch.save({"local": local.item(), "mean": world.mean(local), "grad": model.logits.weight.grad}, f"{out}/{rank}.pt")
    del loss_fn  # DDP's reducer goes before its process group: the other order can abort the process
    gc.collect()  # ... and so does any reference cycle holding it, now rather than at finalization
    dist.barrier()
    teardown()
    os._exit(0)  # the work is saved: skip finalization, where gloo's threads still aborted a run now and then


@pytest.mark.slow
def test_ranks_average_to_the_one_process_gradient_of_the_whole_batch(tmp_path):
    mp.spawn(ddp_step, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2)
    torch.manual_seed(0)
    model = Bigram()
    x, y = global_batch()
    loss = F.cross_entropy(model.logits(x).flatten(0, 1), y.flatten())  # mean over all 4 x 6 targets
    loss.backward()

    ranks = [torch.load(tmp_path / f"{r}.pt") for r in range(2)]
    assert ranks[0]["local"] != pytest.approx(ranks[1]["local"])  # each rank saw other rows
    for r in ranks:
        assert r["mean"] == pytest.approx(loss.item(), rel=1e-6)
        torch.testing.assert_close(r["grad"], model.logits.weight.grad)


def test_teardown_leaves_the_process_group_and_is_a_no_op_without_one(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    teardown()
    assert not dist.is_initialized()
    teardown()


def test_every_hydra_command_leaves_the_process_group_even_when_it_fails(monkeypatch):
    from posbench import cli, distributed

    calls = []
    monkeypatch.setattr(distributed, "teardown", lambda: calls.append("teardown"))
    assert cli.main(["train", "encoding=nope"]) == 2
    assert calls == ["teardown"]


def run(args: list[str], cwd) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow
def test_two_rank_ddp_matches_one_process_on_the_same_global_batch(tmp_path, mini_data):
    # The tiny model has dropout 0, so the two runs differ only by the order of float sums.
    args = [*SMOKE, f"data.path={mini_data}", "train.batch_size=4", "train.val_lens=[64,128]"]
    single_dir = tmp_path / "single"
    run([sys.executable, "-m", "posbench", "train", *args, f"hydra.run.dir={single_dir}"], cwd=tmp_path)
    (tmp_path / "ddp").mkdir()
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    run([*torchrun, "-m", "posbench", "train", *args], cwd=tmp_path / "ddp")  # the default, time-stamped run dir

    run_dirs = [p.parent for p in (tmp_path / "ddp").rglob("train.log")]
    assert len(run_dirs) == 1, f"the ranks should share one run folder, found {run_dirs}"
    ddp_dir = run_dirs[0]
    assert sorted(p.name for p in (ddp_dir / ".hydra").iterdir()) == ["config.yaml", "hydra.yaml", "overrides.yaml"]
    assert (ddp_dir / "train.log").read_text().count("model:") == 1  # rank 1 logs nothing to the file

    single_log, ddp_log = (pd.read_csv(d / "train_log.csv") for d in (single_dir, ddp_dir))
    assert list(ddp_log["step"]) == list(single_log["step"]) == list(range(1, 7))
    assert list(ddp_log["tokens"]) == list(single_log["tokens"])  # tokens of the global batch, not one rank's
    assert single_log["valid_loss_128"].notna().sum() == 2  # rank 0 measures train.val_lens at each validation
    for column in ("train_loss", "valid_loss", "valid_loss_64", "valid_loss_128", "grad_norm"):
        assert ddp_log[column].to_numpy() == pytest.approx(single_log[column].to_numpy(), rel=1e-5, nan_ok=True)
    assert single_log["train_loss"].iloc[-1] < single_log["train_loss"].iloc[0]  # it did learn

    single, ddp = (pd.read_csv(d / "results.csv") for d in (single_dir, ddp_dir))
    assert list(ddp["eval_len"]) == list(single["eval_len"]) and list(ddp["tokens"]) == list(single["tokens"])
    assert ddp["ppl"].to_numpy() == pytest.approx(single["ppl"].to_numpy(), rel=1e-5)


@pytest.mark.slow
def test_sweep_under_torchrun_is_refused_with_one_line(tmp_path, mini_data):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    done = subprocess.run(
        [*torchrun, "-m", "posbench", "-m", "train", *SMOKE, "seed=0,1", f"data.path={mini_data}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode != 0
    assert "posbench: error: torchrun runs one training job" in done.stderr
