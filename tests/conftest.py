"""Shared fixtures: the WikiText-2 slice shipped with posbench and composed configs."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from posbench.config import CONFIG_DIR, register_configs
from posbench.data import shipped_folder

REPO = Path(__file__).resolve().parents[1]
MINI = shipped_folder("wikitext-2-mini")


@pytest.fixture
def mini_data() -> Path:
    """The WikiText-2 slice shipped with posbench (data=wikitext2_mini)."""
    return MINI


@pytest.fixture
def compose_config():
    """compose_config("train", ["encoding=rope", ...]) -> the composed DictConfig."""
    register_configs()

    def _compose(config_name: str = "train", overrides: list[str] | None = None):
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            return compose(config_name, overrides=overrides or [])

    return _compose
