"""Expensive knobs: a value that cannot fit is refused up front naming its key; a costly one warns with an estimate."""

from __future__ import annotations

import logging

import pytest
import torch

from posbench.config import check_config
from posbench.data import load_corpus
from posbench.errors import PosbenchError
from posbench.probes.suite import check_probe_data
from posbench.train import train


@pytest.fixture
def smoke(compose_config, mini_data):
    return lambda *overrides: compose_config("train", ["experiment=smoke", f"data.path={mini_data}", *overrides])


@pytest.mark.parametrize("encoding", ["rope", "learned"])
def test_randomized_positions_past_memory_are_refused_naming_the_key(smoke, encoding):
    with pytest.raises(PosbenchError, match=r"^encoding.randomized_positions=100000000000 needs .* GB for its "):
        check_config(smoke(f"encoding={encoding}", "encoding.randomized_positions=100000000000"))


def test_costly_randomized_positions_warn_with_an_estimate_and_go_on(smoke, caplog):
    from posbench.costs import warn_randomized_positions

    cfg = smoke("encoding=rope", "encoding.randomized_positions=100000000")
    check_config(cfg)
    with caplog.at_level(logging.WARNING):
        warn_randomized_positions(cfg)
    [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]  # not an earlier INFO line
    assert (
        "encoding.randomized_positions=100000000 draws 4 x 100,000,000" in line and "GB" in line and "s a step" in line
    )


def test_a_copy_probe_span_past_memory_is_refused_and_a_costly_one_warns(smoke, caplog):
    cfg = smoke("probes=[copy]", "probe.span=1000000000")
    corpus = load_corpus(cfg.data)
    with pytest.raises(PosbenchError, match=r"^probe.span=1000000000: the copy probe's logits .* need .* GB"):
        check_probe_data(corpus, cfg, torch.device("cpu"))
    with caplog.at_level(logging.WARNING):
        check_probe_data(corpus, smoke("probes=[copy]", "probe.span=20000", "model=paper"), torch.device("cpu"))
    [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]  # not an earlier INFO line
    assert line.startswith("the copy probe (probe.span=20000, probe.trials=64, ") and " h on a CPU" in line


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["probes=[context]", "probe.contexts=[100000]"], "probe.contexts=[100000]: the test split has"),
        (["probes=[copy]", "probe.distances=[100000]"], "probe.distances=[100000]: the test split has"),
    ],
)
def test_probe_options_the_data_cannot_serve_stop_train_before_its_first_step(smoke, tmp_path, overrides, message):
    with pytest.raises(PosbenchError, match=message.replace("[", r"\[")):
        train(smoke(*overrides), tmp_path)
    assert not (tmp_path / "train_log.csv").exists() and not (tmp_path / "checkpoint.pt").exists()
