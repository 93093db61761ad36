"""``posbench probe`` and ``train probes=[...]``: the probes' CSVs in the run folder, merged; bad input as one line."""

import pandas as pd
import pytest

from posbench.checkpoint import CHECKPOINT
from posbench.commands import probe as probe_command
from posbench.commands.eval import evaluate_checkpoint, register
from posbench.errors import PosbenchError
from posbench.probes.suite import run_probes
from posbench.runfolder import ATTENTION_CSV, BIAS_CSV, CONTEXT_CSV, COPY_CSV
from posbench.runfolder import PROBE_IDENTITY as IDENTITY
from posbench.saved_run import load_run

SMALL = ["eval.max_tokens=2048", "eval.splits=[test]", "probe.targets=64", "probe.trials=4", "probe.block=16"]


@pytest.fixture
def probe(compose_config):
    """probe(run, overrides) as `posbench probe checkpoint=run SMALL overrides...` would, writing into run."""
    probe_command.register()

    def _probe(run, overrides, out=None):
        command = compose_config("probe", [f"checkpoint={run}", *SMALL, *overrides])
        keys = ["checkpoint", *(o.split("=")[0] for o in SMALL + overrides)]
        probe_command.probe_checkpoint(command, keys, out or run)

    return _probe


def read(path):
    return pd.read_csv(path, keep_default_na=False, na_values=[""])


def test_every_probe_writes_its_csv_and_a_rerun_replaces_its_rows(tmp_path, saved_run, probe):
    run = saved_run(tmp_path / "run", encoding="alibi")
    probe(run, [])
    tables = {name: read(run / name) for name in (CONTEXT_CSV, COPY_CSV, ATTENTION_CSV, BIAS_CSV)}
    for table in tables.values():
        assert list(table.columns[:4]) == IDENTITY
        assert set(table["encoding"]) == {"alibi"} and set(table["train_len"]) == {32}
    context = tables[CONTEXT_CSV]
    assert (context["status"] == "ok").all() and set(context["context"]) >= {16, 32, 512}
    assert set(tables[COPY_CSV]["distance"]) == {0, 16, 32, 64, 128, 256, 512}
    assert set(tables[ATTENTION_CSV]["eval_len"]) == {32, 128, 512}
    assert set(tables[BIAS_CSV]["head"]) == set(range(4))
    results = read(run / "results.csv")
    assert set(results["variant"]) == {"window32"} and len(results) == 5
    probe(run, ["probes=[copy,window]"])
    for name, table in tables.items():
        assert len(read(run / name)) == len(table), name
    assert len(read(run / "results.csv")) == 5


def test_the_window_probe_at_eval_len_equals_the_plain_evaluation(tmp_path, saved_run, probe, compose_config):
    """W = train_len = 32: at eval_len 32 the windowed rows are the plain ones exactly; beyond, they differ."""
    run = saved_run(tmp_path / "run")
    register()
    command = compose_config("eval", [f"checkpoint={run}", "eval.max_tokens=2048", "eval.splits=[test]"])
    evaluate_checkpoint(command, ["checkpoint", "eval.max_tokens", "eval.splits"], run)
    probe(run, ["probes=[window]"])
    results = read(run / "results.csv").fillna({"variant": ""}).set_index(["variant", "eval_len"])
    assert results.loc[("window32", 32), "nll"] == results.loc[("", 32), "nll"]
    assert results.loc[("window32", 128), "nll"] != results.loc[("", 128), "nll"]
    probe(run, ["probes=[window]", "eval.window=64", "rope.scaling.type=yarn", "rope.scaling.factor=2"])
    assert "yarn×2+window64" in set(read(run / "results.csv")["variant"])


def test_probes_run_in_the_evaluation_time_variant_and_are_labelled_by_it(tmp_path, saved_run, probe):
    plain, windowed = saved_run(tmp_path / "plain"), saved_run(tmp_path / "windowed")
    probe(plain, ["probes=[context,copy,attention]"])
    probe(windowed, ["probes=[context,copy,attention]", "eval.window=4", "eval.attn_temperature=1.5"])
    for name in (CONTEXT_CSV, COPY_CSV, ATTENTION_CSV):
        assert set(read(windowed / name)["variant"]) == {"window4+temp1.5"}, name
    attention = read(windowed / ATTENTION_CSV)
    assert attention["mean_distance"].max() < 4
    at = lambda run: read(run / CONTEXT_CSV).query("subset == 'all'").set_index("context")["nll"]  # noqa: E731
    assert at(windowed)[512] != at(plain)[512]
    assert (read(windowed / COPY_CSV)["nll_copy"] != read(plain / COPY_CSV)["nll_copy"]).all()


def test_learned_beyond_its_table_gives_unsupported_rows(tmp_path, saved_run, probe):
    run = saved_run(tmp_path / "run", encoding="learned")
    probe(run, ["probes=[context,copy,attention]"])
    context, copies = read(run / CONTEXT_CSV), read(run / COPY_CSV)
    assert set(context[context["context"] > 32]["status"]) == {"unsupported"}
    assert set(context[context["context"] <= 16]["status"]) == {"ok"}
    assert set(copies[copies["distance"] > 0]["status"]) == {"unsupported"}
    attention = read(run / ATTENTION_CSV)
    assert set(attention[attention["eval_len"] > 32]["status"]) == {"unsupported"}
    assert not (run / BIAS_CSV).exists()  # learned has no bias


def test_copy_rows_of_other_words_are_other_rows(tmp_path, saved_run, probe):
    """probe.vocab is part of a copy row's identity: spans of 8 words add rows, and a rerun replaces only its own."""
    run = saved_run(tmp_path / "run", encoding="alibi")
    probe(run, ["probes=[copy]", "probe.distances=[0,16]"])
    every_word = read(run / COPY_CSV)
    probe(run, ["probes=[copy]", "probe.distances=[0,16]", "probe.vocab=8"])
    probe(run, ["probes=[copy]", "probe.distances=[0,16]", "probe.vocab=8"])
    table = read(run / COPY_CSV)
    assert table["vocab"].isna().sum() == 2 and table["vocab"].tolist()[2:] == [8, 8]
    assert table[table["vocab"].isna()]["nll_copy"].tolist() == every_word["nll_copy"].tolist()
    assert (table[table["vocab"] == 8]["nll_copy"].to_numpy() != every_word["nll_copy"].to_numpy()).all()
    probe(run, ["probes=[copy]", "probe.distances=[0,16]"])
    assert len(read(run / COPY_CSV)) == 4
    with pytest.raises(PosbenchError, match="probe.vocab=99999 exceeds the vocabulary's"):
        probe(run, ["probes=[copy]", "probe.vocab=99999"])


def test_a_resumed_copy_probe_keeps_only_its_own_words_distances(tmp_path, saved_run, probe, compose_config):
    """Training's finish, resumed (keep_measured), skips distances measured on these weights with the same
    words only: rows of every word's spans do not stand in for spans of 8 words."""
    run = saved_run(tmp_path / "run", encoding="alibi")
    probe(run, ["probes=[copy]", "probe.distances=[0,16]"])
    overrides = [*SMALL, "probes=[copy]", "probe.distances=[0,16]", "probe.vocab=8"]
    command = compose_config("probe", [f"checkpoint={run}", *overrides])
    loaded = load_run(command, ["checkpoint", *(o.split("=")[0] for o in overrides)])
    loaded.cfg.probes, loaded.cfg.probe = command.probes, command.probe
    run_probes(loaded.model, loaded.corpus, loaded.cfg, loaded.device, run, loaded.state, keep_measured=True)
    assert read(run / COPY_CSV)["vocab"].fillna(0).tolist() == [0, 0, 8, 8]


def test_probes_write_elsewhere_when_told(tmp_path, saved_run, probe):
    run, elsewhere = saved_run(tmp_path / "run"), tmp_path / "elsewhere"
    probe(run, ["probes=[copy]"], out=elsewhere)
    assert (elsewhere / COPY_CSV).is_file() and not (run / COPY_CSV).exists()


def test_unknown_probe_and_bad_options_are_refused_naming_the_key(tmp_path, saved_run, compose_config):
    probe_command.register()
    run = saved_run(tmp_path / "run")
    with pytest.raises(PosbenchError, match="unknown probe 'contxt'.*probes: context, window, copy, attention"):
        probe_command.check(compose_config("probe", [f"checkpoint={run}", "probes=[contxt]"]))
    with pytest.raises(PosbenchError, match="probe.trials=0 must be at least 1"):
        probe_command.check(compose_config("probe", [f"checkpoint={run}", "probe.trials=0"]))
    with pytest.raises(PosbenchError, match=r"probes=\[\] names no probe for posbench probe to run"):
        probe_command.check(compose_config("probe", [f"checkpoint={run}", "probes=[]"]))


@pytest.mark.slow
def test_probe_command_end_to_end(tmp_path, saved_run, posbench, assert_one_line):
    run = saved_run(tmp_path / "run")
    done = posbench("probe", f"checkpoint={run / CHECKPOINT}", "probes=[copy]", *SMALL)
    assert done.returncode == 0, done.stderr
    assert len(read(run / COPY_CSV)) == 7
    assert_one_line(posbench("probe", f"checkpoint={run}", "probes=[copy,nope]"), "unknown probe 'nope'")


@pytest.mark.slow
def test_train_runs_its_probes_at_the_end(tmp_path, posbench, mini_data):
    done = posbench(
        "train", "experiment=smoke", f"data.path={mini_data}", f"hydra.run.dir={tmp_path}", "probes=[copy]", *SMALL[2:]
    )
    assert done.returncode == 0, done.stderr
    assert set(read(tmp_path / COPY_CSV)["distance"]) == {0, 16, 32, 64, 128, 256, 512}


def test_every_broken_probe_option_comes_back_at_once(tmp_path, posbench, assert_one_line):
    """A missing checkpoint and three mistakes in probes=[...] and probe.*: one line names all four, exit 2."""
    given = ["probes=[contxt]", "probe.trials=0", "probe.seed=-1"]
    result = posbench("probe", f"checkpoint={tmp_path / 'missing'}", *given)
    assert_one_line(result, "4 problems", "does not exist", "unknown probe 'contxt'", "probe.trials=0", "probe.seed=-1")
