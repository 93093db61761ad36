"""Log-n attention scaling (model.logn_scaling): queries past the training length scaled by log(n+1)/log(L)."""

from __future__ import annotations

import math

import pytest
import torch

from posbench.variant import logn_factors

TRAIN_LEN, SEQ = 8, 20


def test_factors_are_one_up_to_the_training_length_then_log_n_over_log_l():
    expected = [max(1.0, math.log(n + 1) / math.log(TRAIN_LEN)) for n in range(SEQ)]
    assert logn_factors(SEQ, TRAIN_LEN).tolist() == pytest.approx(expected, rel=1e-6)
    assert logn_factors(SEQ, TRAIN_LEN)[TRAIN_LEN] > 1.0  # position L: log(L + 1) / log(L)


@pytest.mark.parametrize("encoding", ["alibi", "rope", "none"])
def test_every_logit_before_the_training_length_is_unchanged(tiny_lm, encoding):
    idx = torch.randint(0, 50, (2, SEQ), generator=torch.Generator().manual_seed(1))
    targets = idx.roll(-1, dims=1)
    plain = tiny_lm(encoding, train_len=TRAIN_LEN).eval().token_nll(idx, targets)
    scaled_model = tiny_lm(encoding, train_len=TRAIN_LEN, logn_scaling=True).eval()
    scaled = scaled_model.token_nll(idx, targets)
    assert torch.equal(scaled[:, :TRAIN_LEN], plain[:, :TRAIN_LEN])  # causal: earlier queries never see the scale
    assert not torch.allclose(scaled[:, TRAIN_LEN:], plain[:, TRAIN_LEN:])
    short = tiny_lm(encoding, train_len=TRAIN_LEN).eval().token_nll(idx[:, :TRAIN_LEN], targets[:, :TRAIN_LEN])
    assert torch.equal(scaled_model.token_nll(idx[:, :TRAIN_LEN], targets[:, :TRAIN_LEN]), short)  # training length


def test_logn_scaling_with_a_training_length_of_one_is_one_line(compose_config):
    from posbench.config import check_config
    from posbench.errors import PosbenchError

    cfg = compose_config("train", ["experiment=smoke", "model.logn_scaling=true", "train_len=1", "eval_lens=[4]"])
    with pytest.raises(PosbenchError, match=r"model\.logn_scaling needs train_len >= 2"):
        check_config(cfg)


def test_posbench_eval_with_logn_scaling_on_a_run_trained_without_it(tmp_path, saved_run, compose_config):
    """Log-n scaling changes no weight: a saved smoke run (train_len 32) evaluated with it gets ``variant=logn``
    rows, the same numbers at train_len (no query past it) and others at 2x."""
    import pandas as pd

    from posbench.commands.eval import evaluate_checkpoint, register

    run = saved_run(tmp_path / "run", encoding="rope")
    register()
    for extra in ([], ["model.logn_scaling=true"]):
        overrides = [f"checkpoint={run}", "eval_lens=[32,64]", "eval.max_tokens=600", "eval.splits=[test]", *extra]
        evaluate_checkpoint(compose_config("eval", overrides), [o.split("=")[0] for o in overrides], run)
    nll = pd.read_csv(run / "results.csv", keep_default_na=False).set_index(["variant", "eval_len"])["nll"]
    assert set(nll.index.get_level_values("variant")) == {"", "logn"}
    assert nll[("logn", 32)] == pytest.approx(nll[("", 32)], rel=1e-6) and nll[("logn", 64)] != nll[("", 64)]
