"""Adding a command is one module of ``posbench.commands`` and its line in ``cli.COMMANDS``: this test adds a
throwaway command in the test itself, and the command line checks its config, runs it and lists it."""

import sys
import types
from dataclasses import dataclass
from pathlib import Path

from hydra.core.config_store import ConfigStore

from posbench import cli
from posbench.errors import raise_problems


@dataclass
class ToyConfig:
    count: int = 1
    word: str = "toy"
    debug: bool = False


def toy_module() -> types.ModuleType:
    """What ``src/posbench/commands/toy.py`` would hold: its config dataclass, register, check and run."""
    toy = types.ModuleType("posbench.commands.toy")
    toy.ToyConfig = ToyConfig
    toy.register = lambda: ConfigStore.instance().store(name="toy", node=ToyConfig)

    def check(cfg) -> None:
        found = [f"count must be positive, got {cfg.count}"] if cfg.count < 1 else []
        raise_problems(found + ([] if cfg.word else ["word must not be empty"]))

    def run(cfg, run_dir: Path) -> None:
        (Path(run_dir) / "toy.txt").write_text(cfg.word * cfg.count)

    toy.check, toy.run = check, run
    return toy


def test_a_new_command_runs_checks_and_is_listed(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "posbench.commands.toy", toy_module())
    monkeypatch.setitem(cli.COMMANDS, "toy", "a throwaway command")

    assert cli.main(["toy", "count=2", "word=ab", f"hydra.run.dir={tmp_path}"]) == 0
    assert (tmp_path / "toy.txt").read_text() == "abab"

    assert cli.main(["toy", "count=0", "word=", f"hydra.run.dir={tmp_path / 'refused'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == "posbench: error: 2 problems: (1) count must be positive, got 0; (2) word must not be empty"
    assert not (tmp_path / "refused").exists()  # checked before Hydra made a folder

    assert cli.main(["--help"]) == 0
    assert "  toy      a throwaway command" in capsys.readouterr().out
