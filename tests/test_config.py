"""The configs: every preset composes and passes the checks; conf/encoding and the registry agree."""

from __future__ import annotations

import pytest
import yaml

from posbench.config import CONFIG_DIR, check_config
from posbench.positional import ENCODINGS

EXPERIMENTS = sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("experiment", EXPERIMENTS)
@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
def test_every_experiment_composes_with_every_encoding(compose_config, experiment, encoding):
    cfg = compose_config("train", [f"experiment={experiment}", f"encoding={encoding}"])
    check_config(cfg)
    assert cfg.encoding.name == encoding


def test_conf_encoding_holds_exactly_the_registered_encodings():
    assert sorted(p.stem for p in (CONFIG_DIR / "encoding").glob("*.yaml")) == sorted(ENCODINGS)


def test_there_are_presets_to_compose():
    assert {"paper", "quick", "smoke", "study"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("command", ["train", "eval", "probe", "bench"])
def test_every_command_summarises_its_sweeps(command):
    # Without the callback a sweep whose jobs fail would exit 0: each job records its failure and goes on.
    hydra = yaml.safe_load((CONFIG_DIR / f"{command}.yaml").read_text())["hydra"]
    assert hydra["callbacks"]["sweep_summary"]["_target_"] == "posbench.sweep.SweepSummary"
