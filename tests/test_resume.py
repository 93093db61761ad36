"""Resuming: which settings may change, where training continues from, when a run counts as finished."""

from __future__ import annotations

import pytest
import yaml

from posbench.checkpoint import CHECKPOINT, RESUME_CHECKPOINT
from posbench.config import CONFIG_DIR
from posbench.errors import PosbenchError
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
