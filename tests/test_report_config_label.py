"""The report's config label: runs of one line are told apart by the config keys that change results, read on
today's schema, so that a key added since a run was trained does not set it apart from runs trained later."""

from __future__ import annotations

import math

import pandas as pd
from omegaconf import OmegaConf

from posbench.config import Config
from posbench.evaluate import RESULT_COLUMNS
from posbench.positional import ENCODINGS
from posbench.report import report
from posbench.report.config_label import result_changing
from posbench.runfolder import RESULTS, ModelState, merge_rows, save_run_config


def full_config(seed: int = 0, **train) -> dict:
    """A whole config of an ALiBi run as training saves it, ``train`` keys set."""
    cfg = OmegaConf.structured(Config)
    cfg.encoding = OmegaConf.structured(ENCODINGS["alibi"][0])
    config = OmegaConf.to_container(cfg)
    config["train"].update(train)
    return config | dict(seed=seed)


def trained_before(config: dict, *keys: str) -> dict:
    """``config`` as a version of posbench saved it that had no ``train.<key>`` for these keys."""
    return config | dict(train={k: v for k, v in config["train"].items() if k not in keys})


def test_a_key_added_since_a_run_was_trained_reads_as_its_default():
    old = trained_before(full_config(), "copy_loss", "copy_warmup_steps")
    assert "copy_loss" not in old["train"]
    assert result_changing(old) == result_changing(full_config())
    assert result_changing(full_config(copy_loss="copy"))["train.copy_loss"] == "copy"


def test_a_config_that_no_longer_fits_the_schema_is_compared_as_saved():
    retired = full_config()
    retired["train"]["retired_option"] = 3
    assert result_changing(retired)["train.retired_option"] == 3
    edited = full_config(lr="${nowhere}")  # an interpolation that resolves to nothing
    assert result_changing(edited)["train.lr"] == "${nowhere}"


def write_run(folder, run_id: str, config: dict, ppl: float) -> None:
    """A finished ALiBi run at train_len 4 with one test row at 4 and its saved config."""
    row = dict(encoding="alibi", variant="", train_len=4, train_lengths="4", eval_len=4, split="test")
    row.update(eval_mode="nonoverlapping", stride=4, tokens=64, unigram_ppl=25.0, seed=config["seed"], params=1)
    row.update(encoding_params=0, run_dir=str(folder), status="ok", reason="", nll=math.log(ppl), ppl=ppl)
    merge_rows(folder, RESULTS, pd.DataFrame([row], columns=RESULT_COLUMNS), ModelState(run_id, 100, True))
    save_run_config(folder, run_id, config)


def test_seeds_of_older_and_newer_code_are_averaged_and_a_changed_key_sets_a_run_apart(tmp_path, figure_legends):
    write_run(tmp_path / "old", "old", trained_before(full_config(0), "copy_loss", "copy_warmup_steps"), 10.0)
    write_run(tmp_path / "new", "new", full_config(1, val_lens=[4, 16]), 12.0)  # losses logged at more lengths
    write_run(tmp_path / "copies", "copies", full_config(2, copy_fraction=0.25), 30.0)
    summary = pd.read_csv(report(tmp_path) / "summary.csv", keep_default_na=False)
    by_config = summary.set_index("config")
    assert sorted(summary["config"]) == ["train.copy_fraction=0.0", "train.copy_fraction=0.25"]
    assert by_config.loc["train.copy_fraction=0.0", "seeds"] == 2
    assert by_config.loc["train.copy_fraction=0.0", "ppl_mean"] == 11.0
    assert by_config.loc["train.copy_fraction=0.25", "ppl_mean"] == 30.0
    named = [n for n in figure_legends["ppl_vs_length.png"] if n.startswith("alibi")]  # a line per model
    assert len(named) == 2 and sorted("copy_fraction=0.25" in n for n in named) == [False, True]
