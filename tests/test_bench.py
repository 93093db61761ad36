"""``posbench bench`` end to end with tiny sizes, and its FLOP count against a hand computation."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir

from posbench import bench as bench_module
from posbench.bench import COLUMNS, bench, flops_per_token
from posbench.commands.bench import check as check_bench
from posbench.commands.bench import register as register_bench_config
from posbench.config import CONFIG_DIR
from posbench.errors import PosbenchError
from posbench.model import ModelConfig


def bench_config(*overrides):
    register_bench_config()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3", job_name="bench"):
        return compose(
            "bench",
            overrides=[
                "model=tiny",
                "vocab_size=64",
                "train_batch=2",
                "train_len=16",
                "train_steps=1",
                "warmup=1",
                "eval_repeats=1",
                "xtransformers=false",
                *overrides,
            ],
        )


def test_flops_per_token_of_the_paper_model():
    """Per layer 4·256² + 2·256·512 weights, tied head 256·33,278; attention 2·T·d per layer."""
    weights = 6 * (4 * 256 * 256 + 2 * 256 * 512) + 256 * 33278  # 11,664,896
    assert flops_per_token(ModelConfig(), 33278, 256, training=False) == 2 * weights + 6 * 2 * 256 * 256 == 24_116_224
    assert flops_per_token(ModelConfig(), 33278, 256, training=True) == 3 * 24_116_224


@pytest.mark.slow
def test_bench_writes_every_encoding_backend_and_length(tmp_path):
    cfg = bench_config("encodings=[alibi,learned]", "backends=[eager,sdpa]", "eval_lens=[16,48]")
    table = bench(cfg, tmp_path)
    written = pd.read_csv(tmp_path / "bench.csv")
    assert list(written.columns) == COLUMNS and len(written) == len(table) == 2 * 2 * (3 + 6)  # 6: decoding
    train = written[written.phase == "train"]
    assert (train.tokens_per_s > 0).all() and (train.gflop_per_s > 0).all()
    assert written[written.backend == "eager"].dropna(subset=["tokens_per_s"]).vs_eager.eq(1.0).all()
    beyond = written[(written.encoding == "learned") & (written.seq_len == 48)]
    assert beyond.status.eq("unsupported").all() and beyond.tokens_per_s.isna().all()  # learned has 16 positions
    # per backend, alibi: train, 2 lengths, decoding at 16, 64, 256 with and without the cache; learned: train, 16
    # and decoding at 16
    assert written[written.status == "ok"].shape[0] == 2 * (1 + 2 + 6) + 2 * (1 + 1 + 2)
    assert "| alibi | sdpa |" in (tmp_path / "bench.md").read_text()


def test_decoding_rows_with_and_without_the_cache_at_1_4_and_16_train_len(tmp_path):
    overrides = ["encodings=[rope,learned]", "backends=[sdpa]", "eval_lens=[]", "train_steps=0", "precisions=[fp32]"]
    written = bench(bench_config(*overrides), tmp_path)
    decoding = written[written.phase.isin(["decode", "decode_nocache"])].set_index(["encoding", "phase", "seq_len"])
    assert len(decoding) == 2 * 2 * 3
    rope = decoding.loc["rope"]
    assert (rope.status == "ok").all() and (rope.tokens_per_s > 0).all()
    # without the cache a token costs a pass over the context: 256 times one token's FLOPs at 256
    assert rope.loc[("decode_nocache", 256), "gflop_per_token"] == pytest.approx(
        256 * rope.loc[("decode", 256), "gflop_per_token"]
    )
    learned = decoding.loc["learned"]
    assert list(learned.status) == ["ok"] * 2 + ["unsupported"] * 4  # its table: 16 positions
    text = (tmp_path / "bench.md").read_text()
    assert "## Decoding" in text and "| rope | sdpa | fp32 | 256 |" in text
    assert "| learned | sdpa | fp32 | 64 |  |  |  | Learned has 16 positions" in text


@pytest.mark.parametrize(
    "override, message",
    [
        ("encodings=[alibj]", "unknown ['alibj']"),
        ("eval_lens=[0]", "eval_lens must hold positive integers, got [0]"),
        ("vocab_size=0", "vocab_size must be a positive integer, got 0"),
        ("train_len=0", "train_len must be a positive integer, got 0"),
        ("train_steps=-1", "train_steps must be 0 or more, got -1"),
        ("backends=[eagre]", "model.attention must be one of"),
        ("device=banana", "device"),
        ("precisions=[fp16]", "precision must be one of auto, fp32, bf16, got 'fp16'"),
        ("encodings=[]", "encodings=[] names nothing to measure; encodings=null measures every encoding"),
        ("backends=[]", "backends=[] names nothing to measure"),
        ("precisions=[]", "precisions=[] names nothing to measure"),
        ("encodings=[alibi,alibi]", "encodings names alibi more than once, got ['alibi', 'alibi']"),
        ("backends=[sdpa,eager,sdpa]", "backends names sdpa more than once"),
        ("eval_lens=[16,16]", "eval_lens names 16 more than once, got [16, 16]"),
    ],
)
def test_bad_numbers_and_names_fail_before_anything_is_measured(override, message):
    with pytest.raises(PosbenchError) as e:
        check_bench(bench_config(override))
    assert message in str(e.value)


def test_no_eval_lens_times_training_alone_but_not_nothing():
    check_bench(bench_config("eval_lens=[]"))
    with pytest.raises(PosbenchError, match=r"eval_lens=\[\] names nothing to measure \(with train_steps=0"):
        check_bench(bench_config("eval_lens=[]", "train_steps=0"))


def test_evaluation_only_bench_has_no_training_table(tmp_path):
    overrides = ["encodings=[none]", "backends=[sdpa]", "eval_lens=[16]", "train_steps=0", "precisions=[fp32]"]
    bench(bench_config(*overrides), tmp_path)
    text = (tmp_path / "bench.md").read_text()
    assert "## Training" not in text and "training steps" not in text
    assert "Medians of 1 evaluations" in text and "| none | sdpa | fp32 | 16 |" in text


def test_every_row_in_each_precision_against_that_precision_s_peak(tmp_path, monkeypatch):
    peaks = {"fp32": 1e9, "bf16": 4e9}
    monkeypatch.setattr(bench_module, "matmul_peak_flops", lambda device, precision: peaks[precision])
    compiled = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, *a, **k: compiled.append(self))  # no 1-minute compile
    axes = ["encodings=[alibi]", "backends=[sdpa]", "eval_lens=[16]", "precisions=[fp32,bf16]", "compile_train=true"]
    table = bench(bench_config(*axes), tmp_path)
    written = pd.read_csv(tmp_path / "bench.csv")
    # per precision: train, compiled train, eval, decoding at 3 lengths with and without the cache
    assert list(written.columns) == COLUMNS and len(table) == 2 * 9
    assert list(written.precision) == ["fp32"] * 9 + ["bf16"] * 9
    assert list(written.compile) == ([False] * 8 + [True]) * 2 and len(compiled) == 2 * 2
    ok = written[written.status == "ok"]
    expected = ok.gflop_per_s * 1e9 / ok.precision.map(peaks)
    assert ok.peak_fraction.to_numpy() == pytest.approx(expected.to_numpy())
    text = (tmp_path / "bench.md").read_text()
    assert "matmul peak fp32 1.0 GFLOP/s, bf16 4.0 GFLOP/s" in text
    assert "| alibi | sdpa, compiled | bf16 |" in text and "| alibi | sdpa | fp32 | 16 |" in text


def test_a_content_encoding_is_timed_on_eager_alone_and_other_backends_say_why(tmp_path):
    """FoX computes through its layers' terms, which sdpa cannot serve: an sdpa row would time eager."""
    table = bench(bench_config("encodings=[fox]", "backends=[eager,sdpa]", "eval_lens=[16]"), tmp_path)
    sdpa, eager = table[table.backend == "sdpa"], table[table.backend == "eager"]
    assert len(sdpa) == 1 and sdpa.status.eq("skipped").all() and "the sdpa backend cannot" in sdpa.reason.iloc[0]
    assert eager.status.eq("ok").any() and (eager[eager.status == "ok"].tokens_per_s > 0).all()
    assert "the sdpa backend cannot" in (tmp_path / "bench.md").read_text()


@pytest.mark.slow
def test_foxs_flex_rows_run_and_stick_breakings_say_why(tmp_path):
    """FoX's terms run on flex (``terms_on_flex``): its evaluation is timed there; stick-breaking's cannot."""
    table = bench(bench_config("encodings=[fox,stickbreaking]", "backends=[flex]", "eval_lens=[16]"), tmp_path)
    fox, stickbreaking = table[table.encoding == "fox"], table[table.encoding == "stickbreaking"]
    assert fox[fox.phase == "eval"].status.eq("ok").all() and fox[fox.phase == "eval"].tokens_per_s.gt(0).all()
    assert fox[fox.phase == "train"].reason.eq("FlexAttention has no backward on CPU").all()
    assert len(stickbreaking) == 1 and "the flex backend cannot" in stickbreaking.reason.iloc[0]
