"""Shared fixtures: the WikiText-2 slice and composed configs."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from posbench.config import CONFIG_DIR, register_configs

REPO = Path(__file__).resolve().parents[1]
MINI = REPO.parent / "shared" / "data" / "wikitext-2-mini"


@pytest.fixture
def mini_data() -> Path:
    if not (MINI / "train.txt").is_file():
        pytest.skip(f"the WikiText-2 slice is not at {MINI}")
    return MINI


@pytest.fixture
def compose_config():
    """compose_config("train", ["encoding=rope", ...]) -> the composed DictConfig."""
    register_configs()

    def _compose(config_name: str = "train", overrides: list[str] | None = None):
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            return compose(config_name, overrides=overrides or [])

    return _compose
