"""Adding an encoding is one module, one YAML and its test: nothing else in posbench names it.

A throwaway bias encoding, defined here and configured by a YAML in a temporary config folder,
goes through train, eval, report and bench.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import pytest
import torch
from torch import Tensor, nn

from posbench.cli import main
from posbench.positional import ENCODINGS, Dimensions, EncodingConfig, PositionEncoding

YAML = """\
defaults:
  - /schema/encoding/throwaway@_here_
  - _self_
init_slope: 0.25
"""


@pytest.fixture
def throwaway(tmp_path):
    """Register the encoding ``throwaway`` (a learned linear distance penalty) and its YAML; unregister after."""

    @dataclass
    class ThrowawayConfig(EncodingConfig):
        name: str = "throwaway"
        init_slope: float = 0.5

    class Throwaway(PositionEncoding):
        config_class = ThrowawayConfig

        def __init__(self, cfg: ThrowawayConfig, dims: Dimensions):
            super().__init__(cfg, dims)
            self.slope = nn.Parameter(torch.full((dims.n_heads,), cfg.init_slope))

        def bias_at(self, head: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
            return -self.slope[head] * (q_pos - k_pos)

    (tmp_path / "conf" / "encoding").mkdir(parents=True)
    (tmp_path / "conf" / "encoding" / "throwaway.yaml").write_text(YAML)
    yield f"hydra.searchpath=[file://{tmp_path / 'conf'}]"
    ENCODINGS.pop("throwaway")


@pytest.mark.slow
def test_a_new_encoding_runs_through_train_eval_report_and_bench(throwaway, tmp_path, mini_data, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    common = ["experiment=smoke", "device=cpu", f"data.path={mini_data}", throwaway]
    assert main(["train", "encoding=throwaway", "eval_lens=[32,64]", *common, f"hydra.run.dir={run}"]) == 0
    results = pd.read_csv(run / "results.csv")
    assert set(results["encoding"]) == {"throwaway"} and (results["status"] == "ok").all()
    assert results["encoding_params"].iloc[0] == 4  # one slope per head of the tiny model

    assert main(["eval", f"checkpoint={run}", "eval_lens=[128]", "eval.mode=sliding", "eval.stride=32"]) == 0
    assert 128 in set(pd.read_csv(run / "results.csv")["eval_len"])

    assert main(["report", str(run)]) == 0
    assert "throwaway" in (run / "report" / "summary.md").read_text()

    bench = ["bench", "encodings=[throwaway]", "backends=[sdpa]", "model=tiny", "eval_lens=[64]", "train_steps=1"]
    bench += ["warmup=0", "eval_repeats=1", "xtransformers=false", f"hydra.run.dir={tmp_path / 'bench'}", throwaway]
    assert main(bench) == 0
    assert set(pd.read_csv(tmp_path / "bench" / "bench.csv")["encoding"]) == {"throwaway"}
