"""Resuming: which settings may change, where training continues from, when a run counts as finished."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml
from omegaconf import OmegaConf

from posbench.checkpoint import CHECKPOINT, RESUME_CHECKPOINT, save_checkpoint
from posbench.config import CONFIG_DIR
from posbench.errors import PosbenchError
from posbench.lengths import eval_lens_of
from posbench.resume import RESUME_IGNORED, config_differences, finished_run, flatten, resume_source, start_afresh


def test_flatten_joins_nested_keys_with_dots():
    assert flatten({"a": {"b": 1, "c": {"d": [2]}}, "e": {}, "f": None}) == {"a.b": 1, "a.c.d": [2], "e": {}, "f": None}


def test_config_differences_ignore_only_settings_that_change_no_number(compose_config):
    base = compose_config("train", ["experiment=smoke"])
    other = compose_config(
        "train",
        ["experiment=smoke", "train.resume=false", "data.path=/elsewhere", "device=cpu", "train.checkpoint_every=7"],
    )
    assert config_differences(base, other) == []
    changed = compose_config("train", ["experiment=smoke", "train.steps=7", "encoding=rope"])
    differences = config_differences(base, changed)
    assert "train.steps: 6 -> 7" in differences
    assert any(d.startswith("encoding.name: alibi -> rope") for d in differences)


#: Keys added to the config after runs were saved, each off by default.
ADDED_KEYS = (
    "train.patience",
    "train.lengths",
    "train.copy_fraction",
    "encoding.randomized_positions",
    "model.logn_scaling",
)


def saved_before(cfg, keys=ADDED_KEYS) -> dict:
    """``cfg`` as a run saved before ``keys`` existed would hold it."""
    saved = OmegaConf.to_container(cfg, resolve=True)
    for key in keys:
        section, name = key.split(".")
        del saved[section][name]
    return saved


def test_a_key_added_since_a_run_was_saved_reads_as_its_default(compose_config):
    cfg = compose_config("train", ["experiment=smoke", "encoding=rope"])
    assert config_differences(saved_before(cfg), cfg) == []
    changed = compose_config(
        "train", ["experiment=smoke", "encoding=rope", "train.patience=3", "model.logn_scaling=true"]
    )
    assert config_differences(saved_before(cfg), changed) == [
        "model.logn_scaling: False -> True",
        "train.patience: None -> 3",
    ]
    saved = OmegaConf.to_container(changed, resolve=True)  # a value really saved, and another today
    assert config_differences(saved, cfg) == ["model.logn_scaling: True -> False", "train.patience: 3 -> None"]


def test_a_saved_key_this_version_lacks_is_refused_in_one_line(compose_config, tmp_path):
    cfg = compose_config("train", ["experiment=smoke"])
    saved = OmegaConf.to_container(cfg, resolve=True)
    saved["train"]["retired_option"] = 1
    save_checkpoint(tmp_path / CHECKPOINT, {"model": {}, "config": saved, "vocab": [], "valid_loss": 1.0})
    (tmp_path / "results.csv").write_text("split,eval_len\n")
    with pytest.raises(PosbenchError, match="has another config .*does not fit this version.*retired_option"):
        finished_run(cfg, tmp_path)


def test_a_run_finished_before_keys_were_added_is_skipped_and_a_changed_value_refused(compose_config, tmp_path):
    cfg = compose_config("train", ["experiment=smoke", "encoding=rope"])
    save_checkpoint(tmp_path / CHECKPOINT, {"model": {}, "config": saved_before(cfg), "vocab": [], "valid_loss": 1.5})
    rows = [dict(split=split, eval_len=n, ppl=2.0) for split in cfg.eval.splits for n in eval_lens_of(cfg)]
    pd.DataFrame(rows).to_csv(tmp_path / "results.csv", index=False)
    assert finished_run(cfg, tmp_path)["best_valid_loss"] == 1.5
    randomized = compose_config("train", ["experiment=smoke", "encoding=rope", "encoding.randomized_positions=512"])
    with pytest.raises(PosbenchError, match=r"another config \(encoding.randomized_positions: None -> 512\)"):
        finished_run(randomized, tmp_path)


def test_folder_names_leave_out_exactly_the_keys_resume_ignores():
    # One idea, two places: a key that may change on resume must not rename the run folder, and vice versa.
    hydra = yaml.safe_load((CONFIG_DIR / "train.yaml").read_text())["hydra"]
    assert set(hydra["job"]["config"]["override_dirname"]["exclude_keys"]) == set(RESUME_IGNORED)
    # not the job's number: stable across re-launches; data.path comes back as a tag (it changes the data)
    assert hydra["sweep"]["subdir"] == "${hydra.job.override_dirname}${posbench_data_tag:${data.path}}"


def test_resume_source_follows_train_resume(compose_config, tmp_path):
    def source(value):
        return resume_source(compose_config("train", [f"train.resume={value}"]), tmp_path)

    assert source("auto") is None and source("false") is None
    with pytest.raises(PosbenchError, match="train.resume=true but .* holds no last.pt"):
        source("true")
    (tmp_path / RESUME_CHECKPOINT).write_bytes(b"")
    assert source("auto") == source("true") == tmp_path / RESUME_CHECKPOINT
    assert source("false") is None
    assert source(str(tmp_path)) == tmp_path / RESUME_CHECKPOINT  # a folder means its last.pt
    assert source(str(tmp_path / "elsewhere.pt")) == tmp_path / "elsewhere.pt"


def test_a_folder_holding_last_pt_is_never_finished(compose_config, tmp_path):
    # results.csv beside last.pt comes from `eval` on an interrupted run: training must go on.
    for name in ("results.csv", CHECKPOINT):
        (tmp_path / name).write_text("not read\n")
    cfg = compose_config("train", ["experiment=smoke"])
    with pytest.raises(PosbenchError, match="checkpoint.pt"):  # without last.pt, the run is examined
        finished_run(cfg, tmp_path)
    (tmp_path / RESUME_CHECKPOINT).write_bytes(b"")
    assert finished_run(cfg, tmp_path) is None


def test_start_afresh_removes_results_and_checkpoints_but_not_the_config_or_log(tmp_path):
    removed = ["results.csv", "per_position.csv", "other.csv", "train_log.csv", CHECKPOINT, RESUME_CHECKPOINT]
    removed += ["error.txt", "events.out.tfevents.1700000000.host.1.0"]
    kept = [".hydra/config.yaml", ".hydra/overrides.yaml", "train.log", ".lock", "sub/results.csv"]
    for name in removed + kept:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x\n")
    start_afresh(tmp_path)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == sorted(kept)
