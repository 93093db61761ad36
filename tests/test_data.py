"""Reading the data: tokens, vocabulary, the three sources (data.path, the shipped slice, the Hub) and their checks."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from hydra.core.override_parser.overrides_parser import OverridesParser

import posbench
from posbench import data
from posbench.data import EOS, UNK, DataConfig, build_corpus, load_corpus, shipped_folder, tokenize
from posbench.errors import PosbenchError

REPO = Path(__file__).resolve().parents[1]
ENCODINGS = sorted(file.stem for file in (REPO / "conf" / "encoding").glob("*.yaml"))


def write_splits(folder: Path, **texts: str | bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, text in {"train": "a b\n", "valid": "a\n", "test": "b\n", **texts}.items():
        (folder / f"{split}.txt").write_bytes(text if isinstance(text, bytes) else text.encode())
    return folder


def one_line_error(cfg: DataConfig) -> str:
    with pytest.raises(PosbenchError) as info:
        load_corpus(cfg)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_tokenize_splits_on_whitespace_and_ends_every_line():
    assert tokenize([" = Title = ", "", "a  b\tc"]) == ["=", "Title", "=", EOS, EOS, "a", "b", "c", EOS]


def test_vocabulary_comes_from_train_and_unseen_words_map_to_unk():
    corpus = build_corpus({"train": ["a b", "b c"], "valid": ["c d"], "test": ["a"]})
    assert corpus.vocab == ["a", "b", EOS, "c", UNK]
    assert corpus.splits["train"].tolist() == [0, 1, 2, 1, 3, 2]
    assert corpus.splits["valid"].tolist() == [3, 4, 2]
    assert corpus.splits["test"].dtype == torch.long


@pytest.mark.parametrize(
    "names", [("train.txt", "valid.txt", "test.txt"), ("wiki.train.tokens", "wiki.valid.tokens", "wiki.test.tokens")]
)
def test_local_folder_in_either_naming(tmp_path, names):
    for name, text in zip(names, ["x y\nz\n", "y\n", "x\n"]):
        (tmp_path / name).write_text(text)
    corpus = load_corpus(DataConfig(path=str(tmp_path)))
    assert corpus.splits["train"].tolist() == [0, 1, 2, 3, 2]  # x y <eos> z <eos>
    assert len(corpus.splits["valid"]) == 2


def test_wikitext_slice_statistics(mini_data):
    corpus = load_corpus(DataConfig(path=str(mini_data)))
    train_words = sum(len(line.split()) + 1 for line in (mini_data / "train.txt").read_text().splitlines())
    assert len(corpus.splits["train"]) == train_words
    assert corpus.vocab[corpus.splits["train"][0]] == EOS  # the file opens with an empty line


def test_missing_folder_and_missing_split(tmp_path):
    message = one_line_error(DataConfig(path=str(tmp_path / "nope")))
    assert message == f"data folder {tmp_path / 'nope'} does not exist (data.path)"
    (tmp_path / "train.txt").write_text("a\n")
    with pytest.raises(PosbenchError, match="no valid split"):
        load_corpus(DataConfig(path=str(tmp_path)))


def test_offline_hub_fails_at_once_with_the_way_out(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(data, "_hub_reachable", lambda timeout=3.0: False)
    message = one_line_error(DataConfig())
    assert "data.path=DIR" in message and "data=wikitext2_mini" in message


# --- checks up front --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content, offset",
    [
        ("a b\ncafé\n".encode("latin-1"), 7),  # é is 0xe9 in latin-1, a bad start byte in UTF-8
        (b"\x89PNG\r\n\x1a\n\x00\x00", 0),  # binary
        ("ok é\n".encode() + b"\xff", 6),  # valid UTF-8 up to the last byte
    ],
)
def test_split_that_is_not_utf8_names_the_file_and_the_first_bad_byte(tmp_path, content, offset):
    folder = write_splits(tmp_path, valid=content)
    message = one_line_error(DataConfig(path=str(folder)))
    assert str(folder / "valid.txt") in message and f"byte {offset} " in message and "UTF-8" in message


@pytest.mark.parametrize("split", ["train", "valid", "test"])
@pytest.mark.parametrize("text", ["", "\n\n", " \t\n"])
def test_empty_split_names_the_split_and_the_file(tmp_path, split, text):
    folder = write_splits(tmp_path, **{split: text})
    message = one_line_error(DataConfig(path=str(folder)))
    assert f"the {split} split in {folder} is empty" in message and f"{split}.txt" in message


def test_data_path_that_is_a_file_says_so(tmp_path):
    file = write_splits(tmp_path) / "train.txt"
    message = one_line_error(DataConfig(path=str(file)))
    assert f"data folder {file} is a file, not a folder (data.path)" in message


# --- the slice shipped with posbench ---------------------------------------------------------------


def test_shipped_slice_lives_inside_the_package():
    folder = shipped_folder("wikitext-2-mini")  # what mini_data returns, found through posbench
    assert Path(posbench.__file__).resolve().parent in folder.resolve().parents
    assert sorted(file.name for file in folder.iterdir()) == ["README.md", "test.txt", "train.txt", "valid.txt"]
    assert "CC BY-SA 3.0" in (folder / "README.md").read_text()


def test_shipped_slice_has_the_token_counts_its_readme_states():
    folder = shipped_folder("wikitext-2-mini")
    stated = {
        name: int(count.replace(",", ""))
        for name, count in re.findall(r"^\| (\w+)\.txt +\|.*\| ([\d,]+) \|$", (folder / "README.md").read_text(), re.M)
    }
    corpus = load_corpus(DataConfig(shipped="wikitext-2-mini"))
    assert stated == {split: len(tokens) for split, tokens in corpus.splits.items()}


def test_data_path_wins_over_the_shipped_slice(tmp_path):
    corpus = load_corpus(DataConfig(shipped="wikitext-2-mini", path=str(write_splits(tmp_path))))
    assert corpus.vocab == ["a", "b", EOS, UNK]


def test_unknown_shipped_data_set_lists_the_shipped_ones():
    message = one_line_error(DataConfig(shipped="wikitext-3"))
    assert message == "data.shipped=wikitext-3 is not shipped with posbench; shipped: wikitext-2-mini"


@pytest.mark.slow
def test_a_non_editable_install_carries_the_slice_and_the_configs_and_runs(tmp_path, mini_data):
    source = tmp_path / "source"
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source)
    site = tmp_path / "site"
    pip = ["pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(site), str(source)]
    done = subprocess.run([sys.executable, "-m", *pip], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    installed = site / "posbench" / "datasets" / "wikitext-2-mini"
    for file in mini_data.iterdir():
        assert (installed / file.name).read_bytes() == file.read_bytes()
    assert (site / "posbench" / "conf" / "encoding" / "alibi.yaml").is_file()

    run = [sys.executable, "-m", "posbench", "train", "experiment=smoke", "train.steps=2", "eval_lens=[32]"]
    elsewhere = tmp_path / "elsewhere"  # not the repository: nothing but the installed package to read
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = subprocess.run(
        [sys.executable, "-c", "import posbench; print(posbench.__file__)"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
    )
    assert where.stdout.strip().startswith(str(site))
    done = subprocess.run(run, cwd=elsewhere, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    (results,) = elsewhere.rglob("results.csv")
    assert (pd.read_csv(results)["status"] == "ok").all()


@pytest.mark.parametrize(
    "overrides, name, shipped",
    [
        (["data=wikitext2_mini"], "wikitext2_mini", "wikitext-2-mini"),
        (["experiment=smoke"], "wikitext2_mini", "wikitext-2-mini"),
        (["experiment=quick"], "wikitext2_mini", "wikitext-2-mini"),
        (["experiment=study"], "wikitext2_mini", "wikitext-2-mini"),
        (["experiment=quick", "data=wikitext2"], "wikitext2", None),
        ([], "wikitext2", None),  # the paper preset reads the Hub
    ],
)
def test_presets_select_their_data(compose_config, overrides, name, shipped):
    cfg = compose_config("train", overrides).data
    assert (cfg.name, cfg.shipped, cfg.path) == (name, shipped, None)


# --- make quick and scripts/reproduce.sh -----------------------------------------------------------


@pytest.fixture
def clone(tmp_path) -> Path:
    """The Makefile and reproduce.sh beside conf/encoding with one more encoding, a throwaway one."""
    shutil.copy(REPO / "Makefile", tmp_path)
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "reproduce.sh", tmp_path / "scripts")
    shutil.copytree(REPO / "conf" / "encoding", tmp_path / "conf" / "encoding")
    (tmp_path / "conf" / "encoding" / "throwaway.yaml").write_text("name: throwaway\n")
    return tmp_path


def train_sweeps(command: list[str], cwd: Path, **env: str) -> list[list[str]]:
    """The overrides of each ``posbench -m train`` that ``command`` starts, printed instead of run."""
    done = subprocess.run(command, cwd=cwd, env={**os.environ, "PYTHON": "echo", **env}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.replace("\\\n", " ").splitlines()  # make -n keeps the recipe's continuation lines
    return [line.split("posbench -m train ")[1].split() for line in lines if "posbench -m train " in line]


def values_of(key: str, sweeps: list[list[str]]) -> list[str]:
    return [arg.removeprefix(f"{key}=") for args in sweeps for arg in args if arg.startswith(f"{key}=")]


def names(sweep_value: str) -> list[str]:
    """encoding=a,b,c's names, sorted (bash and make sort by the locale)."""
    return sorted(sweep_value.split(","))


def test_make_quick_sweeps_every_conf_encoding_on_the_shipped_slice(clone):
    [sweep] = train_sweeps(["make", "-n", "quick"], clone)
    [encodings] = values_of("encoding", [sweep])
    assert names(encodings) == sorted(ENCODINGS + ["throwaway"])
    assert "experiment=quick" in sweep and values_of("data.path", [sweep]) == []
    [sweep] = train_sweeps(["make", "-n", "quick", "DATA=/somewhere", "ENCODINGS=rope"], clone)
    assert values_of("encoding", [sweep]) == ["rope"] and values_of("data.path", [sweep]) == ["/somewhere"]


def reproduce(clone: Path, cwd: Path, *stages: str, **env: str) -> list[list[str]]:
    """The arguments of each posbench command that ``scripts/reproduce.sh STAGES`` starts, printed instead of run."""
    command = ["bash", str(clone / "scripts" / "reproduce.sh"), *stages]
    env = {**os.environ, "PYTHON": "echo", "OUT": str(cwd / "out"), **env}
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    commands = sorted(line.split()[2:] for line in done.stdout.splitlines() if line.startswith("-m posbench "))
    for args in commands:
        assert_hydra_reads_run_dir_and_checkpoint_as_one_path(args)
    return commands


def assert_hydra_reads_run_dir_and_checkpoint_as_one_path(args: list[str]) -> None:
    """What Hydra's own override parser makes of the folder arguments: one path each, never a sweep."""
    for override in OverridesParser.create().parse_overrides([a for a in args if "=" in a]):
        if override.key_or_group in ("hydra.run.dir", "checkpoint"):
            assert not override.is_sweep_override() and "=" in override.value(), override.input_line


def test_reproduce_trains_every_conf_encoding_on_the_shipped_slice(clone, tmp_path):
    commands = reproduce(clone, tmp_path, "seed1")
    assert [c[0] for c in commands] == ["train"] * len(commands)
    assert sorted(values_of("encoding", commands)) == sorted(ENCODINGS + ["throwaway"])
    assert all("experiment=study" in c and "seed=1" in c and "train.val_lens=[256,1024,4096]" in c for c in commands)
    folders = [f.strip("'") for f in values_of("hydra.run.dir", commands)]
    assert len(set(folders)) == len(commands) and all(f.startswith(f"{tmp_path}/out/seed1/") for f in folders)
    assert values_of("data.path", commands) == []
    (tmp_path / "data").mkdir()
    commands = reproduce(clone, tmp_path, "seed0", DATA="data")
    assert values_of("data.path", commands) == [str(tmp_path / "data")] * len(commands)


def test_reproduce_quick_is_the_five_seed_encodings_then_report(clone, tmp_path):
    commands = reproduce(clone, tmp_path, QUICK="1")
    trained = [c for c in commands if c[0] == "train"]
    assert sorted(values_of("encoding", trained)) == sorted(["alibi", "rope", "sinusoidal", "learned", "none"])
    assert [c[0] for c in commands if c[0] != "train"] == ["report", "report"]


def test_reproduce_lengths_keep_tokens_per_step_and_evaluate_to_32x_capped(clone, tmp_path):
    for command in reproduce(clone, tmp_path, "lengths"):
        [train_len], [batch] = values_of("train_len", [command]), values_of("train.batch_size", [command])
        [lengths] = values_of("eval_lens", [command])
        lengths = [int(n) for n in lengths.strip("[]").split(",")]
        assert int(train_len) * int(batch) == 1024
        assert lengths == [int(train_len) * m for m in (1, 2, 4, 8, 16, 32) if int(train_len) * m <= 16384]


def test_reproduce_remedies_train_each_remedy_but_randomized_positions_for_none(clone, tmp_path):
    """none has no positions to randomize: that run would repeat the plain one, so it is not started."""
    commands = reproduce(clone, tmp_path, "remedies")
    assert all(c[0] == "train" and "experiment=study" in c for c in commands)
    remedies = {e: [] for e in ["rope", "sinusoidal", "learned", "none"]}
    for command in commands:
        [encoding] = values_of("encoding", [command])
        remedies[encoding].append(tuple(sorted(a for a in command if a.startswith(("train.length", "encoding.")))))
    mixed = ("train.length_order=random", "train.lengths=[64,128,256]")
    curriculum = ("train.length_order=curriculum", "train.lengths=[64,128,256]")
    for encoding, trained in remedies.items():
        randomized = [] if encoding == "none" else [("encoding.randomized_positions=8192",)]
        assert sorted(trained) == sorted([mixed, curriculum, *randomized]), encoding


def test_reproduce_evals_every_finished_seed_run(clone, tmp_path):
    """The evals stage: RoPE scalings on a rope run, log-n and temperatures on seed 0's remedy encodings,
    blockwise on xPos, sliding windows on each; runs of other stages and unfinished ones are left alone:
    one not yet validated (no checkpoint) and one still training (its best checkpoint beside last.pt)."""
    for stage, encoding, seed, files in [
        ("seed0", "rope", 0, ["checkpoint.pt"]),
        ("seed1", "xpos", 1, ["checkpoint.pt"]),
        ("seed2", "alibi", 2, []),
        ("seed2", "fire", 2, ["checkpoint.pt", "last.pt"]),
        ("remedies", "none", 0, ["checkpoint.pt"]),
    ]:
        run = tmp_path / "out" / stage / f"encoding={encoding},seed={seed}"
        (run / ".hydra").mkdir(parents=True)
        config = f"encoding:\n  name: {encoding}\nmodel:\n  name: paper\nseed: {seed}\n"
        (run / ".hydra" / "config.yaml").write_text(config)
        for name in files:
            (run / name).write_text("")
    commands = reproduce(clone, tmp_path, "evals")
    by_run = {}
    for command in commands:
        [checkpoint] = [v.strip("'") for v in values_of("checkpoint", [command])]
        by_run.setdefault(Path(checkpoint).name, []).append(" ".join(a for a in command if "checkpoint=" not in a))
    # quoted: a run folder named by its overrides holds '=' and ',', which Hydra would parse
    assert all(v.startswith("'") and v.endswith("'") for v in values_of("checkpoint", commands))
    rope, xpos = by_run.pop("encoding=rope,seed=0"), by_run.pop("encoding=xpos,seed=1")
    assert by_run == {}
    scalings = [f"rope.scaling.type={t} rope.scaling.factor={f}" for t in ("linear", "ntk", "yarn") for f in (4, 16)]
    assert all(sum(s in c for c in rope) == 1 for s in scalings)
    temperatures = [f"eval.attn_temperature={t}" for t in ("1.25", "1.5", "2")]
    assert all(sum(t in c for c in rope) == 1 for t in temperatures + ["model.logn_scaling=true"])
    assert any("eval.blockwise=256" in c for c in xpos) and not any("logn" in c for c in xpos)
    sliding = "eval.mode=sliding eval.stride=256 eval.max_tokens=32768"
    assert all(any(sliding in c for c in cmds) for cmds in (rope, xpos))
    assert len(rope) == 6 + 4 + 1 and len(xpos) == 2


def test_reproduce_tasks_train_every_encoding_on_each_task_at_the_seed(clone, tmp_path):
    commands = reproduce(clone, tmp_path, "tasks2")
    assert all(c[0] == "train" and "seed=2" in c for c in commands)
    runs = sorted((values_of("task", [c])[0], values_of("encoding", [c])[0]) for c in commands)
    assert runs == sorted((t, e) for t in ("passkey", "mqar", "copy") for e in ENCODINGS + ["throwaway"])
    assert not any("experiment=study" in c for c in commands)  # task=NAME brings its own recipe


def test_reproduce_task_remedies_randomize_positions_on_passkey_and_copy(clone, tmp_path):
    commands = reproduce(clone, tmp_path, "task_remedies")
    assert all(c[0] == "train" and "seed=0" in c and "encoding.randomized_positions=2048" in c for c in commands)
    runs = sorted((values_of("task", [c])[0], values_of("encoding", [c])[0]) for c in commands)
    assert runs == sorted((t, e) for t in ("passkey", "copy") for e in ("rope", "sinusoidal", "learned"))


def test_reproduce_task_evals_extend_the_tasks0_runs_that_learned_their_task(clone, tmp_path):
    """RoPE scalings at x4 and x32 on rope, log-n and temperatures on rope and sinusoidal; nothing on a run that
    did not learn its task, on an unfinished one, on other encodings or on other seeds' task runs."""
    variant_not_learned = "sinusoidal,64,temp2,not_learned"
    for stage, name, status, files in [
        ("tasks0", "task=passkey,encoding=rope,seed=0", "ok", ["checkpoint.pt"]),
        ("tasks0", "task=copy,encoding=sinusoidal,seed=0", "ok", ["checkpoint.pt"]),
        # learned; an earlier call's variant at train_len did not: extended all the same
        ("tasks0", "task=passkey,encoding=sinusoidal,seed=0", f"ok,\n{variant_not_learned}", ["checkpoint.pt"]),
        ("tasks0", "task=copy,encoding=rope,seed=0", "not_learned", ["checkpoint.pt"]),
        ("tasks0", "task=mqar,encoding=rope,seed=0", "ok", ["checkpoint.pt", "last.pt"]),
        ("tasks0", "task=passkey,encoding=alibi,seed=0", "ok", ["checkpoint.pt"]),
        ("tasks1", "task=passkey,encoding=rope,seed=1", "ok", ["checkpoint.pt"]),
    ]:
        run = tmp_path / "out" / stage / name
        (run / ".hydra").mkdir(parents=True)
        encoding = name.split("encoding=")[1].split(",")[0]
        (run / ".hydra" / "config.yaml").write_text(f"encoding:\n  name: {encoding}\nseed: {stage[-1]}\n")
        # the variant column found by its header, wherever it is
        (run / "task_results.csv").write_text(f"encoding,eval_len,variant,status,reason\n{encoding},64,,{status},\n")
        for file in files:
            (run / file).write_text("")
    by_run = {}
    for command in reproduce(clone, tmp_path, "task_evals"):
        [checkpoint] = [v.strip("'") for v in values_of("checkpoint", [command])]
        by_run.setdefault(Path(checkpoint).name, []).append(" ".join(a for a in command[1:] if "=" in a))
    extended = ["task=copy,encoding=sinusoidal,seed=0", "task=passkey,encoding=rope,seed=0"]
    assert sorted(by_run) == sorted([*extended, "task=passkey,encoding=sinusoidal,seed=0"])
    sharpenings = ["model.logn_scaling=true"] + [f"eval.attn_temperature={t}" for t in ("1.25", "1.5", "2")]
    scalings = [f"rope.scaling.type={t} rope.scaling.factor={f}" for t in ("linear", "ntk", "yarn") for f in (4, 32)]
    for name, expected in [("task=copy,encoding=sinusoidal,seed=0", sharpenings),
                           ("task=passkey,encoding=sinusoidal,seed=0", sharpenings),
                           ("task=passkey,encoding=rope,seed=0", scalings + sharpenings)]:  # fmt: skip
        assert sorted(c.split(" checkpoint=")[0].removesuffix(" device=auto") for c in by_run[name]) == sorted(
            expected
        ), name


def test_reproduce_generate_samples_from_every_finished_seed_and_learned_table_run_once(clone, tmp_path):
    """The generate stage: one posbench generate per finished seed or learned_table run (32 prompts), none on a
    run still training or of another stage, and none again once it finished."""
    table = "encoding=learned,max_positions=4096,seed=0"
    for stage, name, files in [
        ("seed0", "encoding=alibi,seed=0", ["checkpoint.pt"]),
        ("seed1", "encoding=rope,seed=1", ["checkpoint.pt", "last.pt"]),
        ("remedies", "encoding=none,lengths=random", ["checkpoint.pt"]),
        ("learned_table", table, ["checkpoint.pt"]),
    ]:
        for file in files:
            (tmp_path / "out" / stage / name).mkdir(parents=True, exist_ok=True)
            (tmp_path / "out" / stage / name / file).write_text("")
    commands = reproduce(clone, tmp_path, "generate")
    assert all(c[0] == "generate" and "generate.prompts=32" in c for c in commands)
    sampled = sorted(Path(v.strip("'")).name for v in values_of("checkpoint", commands))
    assert sampled == ["encoding=alibi,seed=0", table]
    assert reproduce(clone, tmp_path, "generate") == []  # done: marked in the run's evals_done/


def test_reproduce_learned_table_trains_learned_with_a_table_of_16x_train_len_at_three_seeds(clone, tmp_path):
    commands = reproduce(clone, tmp_path, "learned_table")
    assert sorted(values_of("seed", commands)) == ["0", "1", "2"]
    folders = {f.strip("'").rsplit("/", 1)[1] for f in values_of("hydra.run.dir", commands)}
    assert folders == {f"encoding=learned,max_positions=4096,seed={s}" for s in (0, 1, 2)}
    for command in commands:
        assert command[0] == "train" and "encoding.max_positions=4096" in command and "experiment=study" in command
        assert "train.val_lens=[256,1024,4096]" in command and values_of("encoding", [command]) == ["learned"]


def test_reproduce_evals_resume_at_the_evaluation_a_killed_stage_was_in(clone, tmp_path):
    """A finished evaluation is not redone; a failed one is, and so are those with other settings."""
    run = tmp_path / "out" / "seed1" / "encoding=xpos,seed=1"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("encoding:\n  name: xpos\nseed: 1\n")
    (run / "checkpoint.pt").write_text("")
    failing = tmp_path / "fail_sliding"  # a python that fails the sliding evaluation, as a kill would
    failing.write_text('#!/usr/bin/env bash\n[[ "$*" == *sliding* ]] && exit 1\necho "$@"\n')
    failing.chmod(0o755)
    done = subprocess.run(
        ["bash", str(clone / "scripts" / "reproduce.sh"), "evals"],
        cwd=tmp_path,
        env={**os.environ, "PYTHON": str(failing), "OUT": str(tmp_path / "out")},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and "eval.blockwise=256" in done.stdout
    [again] = reproduce(clone, tmp_path, "evals")
    assert "eval.mode=sliding" in again and not any("blockwise" in a for a in again)
    assert reproduce(clone, tmp_path, "evals") == []
    [strided] = reproduce(clone, tmp_path, "evals", STRIDE="128")
    assert "eval.stride=128" in strided


def test_reproduce_archive_copies_finished_runs_without_checkpoints(clone, tmp_path):
    """The archive stage keeps what report reads (CSVs, logs, configs) of each finished run, and no checkpoint;
    a run still training (last.pt beside its best checkpoint) is left out until it ends."""
    out = tmp_path / "out"
    kept = ["results.csv", "per_article.csv", "train.log", ".hydra/config.yaml", ".hydra/eval/overrides.yaml"]
    for run, files in [
        ("remedies/encoding=rope,lengths=random", ["checkpoint.pt", *kept]),
        ("lengths/encoding=none,train_len=64", ["checkpoint.pt", "last.pt", "train_log.csv"]),
        ("remedies/report", ["summary.csv"]),
    ]:
        for name in files:
            (out / run / name).parent.mkdir(parents=True, exist_ok=True)
            (out / run / name).write_text(name)
    assert reproduce(clone, tmp_path, "archive", ARCHIVE=str(tmp_path / "kept")) == []
    archived = sorted(str(p.relative_to(tmp_path / "kept")) for p in (tmp_path / "kept").rglob("*") if p.is_file())
    stored = [f"{name}.gz" if name == "per_article.csv" else name for name in kept]  # gzipped: most of the bytes
    assert archived == sorted(f"remedies/encoding=rope,lengths=random/{name}" for name in stored)
    config = tmp_path / "kept/remedies/encoding=rope,lengths=random/.hydra/config.yaml"
    assert config.read_text() == ".hydra/config.yaml"


def test_reproduce_skips_samples_an_earlier_call_finished_whatever_its_jobs(clone, tmp_path):
    """The generate stage's mark records what changes the samples: one thread a process (JOBS=2) does not."""
    run = tmp_path / "out" / "seed0" / "encoding=alibi,seed=0"
    run.mkdir(parents=True)
    (run / "checkpoint.pt").write_text("")
    [first] = reproduce(clone, tmp_path, "generate", JOBS="2")
    assert first[0] == "generate" and "threads=1" in first
    assert reproduce(clone, tmp_path, "generate", JOBS="1") == []
    assert reproduce(clone, tmp_path, "generate", JOBS="1", PROMPTS="8") != []
