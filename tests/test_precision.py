"""precision=fp32|bf16|auto: bf16 autocast moves the loss and perplexity by well under 1%, masks keep their
fp32 biases, ``auto`` follows the hardware, and a run saved before the key resumes as what it ran with."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from posbench import runtime
from posbench.backends import sdpa_attention
from posbench.commands.eval import evaluate_checkpoint, register
from posbench.config import check_config
from posbench.data import load_corpus
from posbench.errors import PosbenchError
from posbench.masks import causal_mask
from posbench.model import LanguageModel, ModelConfig
from posbench.optim import make_optimizer
from posbench.positional import ENCODINGS, build_encoding
from posbench.resume import config_differences
from posbench.train import sample_batch, train

SMALL = ModelConfig(name="small", n_layers=2, d_model=64, n_heads=4, d_ff=128, dropout=0.0, attention="sdpa")


@pytest.fixture
def cpu_flags(monkeypatch):
    """cpu_flags(*flags): pretend /proc/cpuinfo lists exactly these flags."""
    return lambda *flags: monkeypatch.setattr(runtime, "cpu_flags", lambda: set(flags))


def test_auto_is_bf16_only_where_bf16_is_native(cpu_flags):
    cpu_flags("avx2", "avx512f")
    precision, why = runtime.resolve_precision("auto", "cpu")
    assert precision == "fp32" and "avx512_bf16" in why
    cpu_flags("avx512f", "avx512_bf16")
    assert runtime.resolve_precision("auto", "cpu") == ("bf16", "precision=auto: this CPU has avx512_bf16")
    cpu_flags("amx_bf16")
    assert runtime.resolve_precision("auto", "cpu")[0] == "bf16"
    cpu_flags()
    assert runtime.resolve_precision("bf16", "cpu") == (
        "bf16",
        "precision=bf16, emulated: this CPU has none of avx512_bf16, amx_bf16",
    )  # asked for, it is what runs; the log says why it is slow
    assert runtime.resolve_precision("bf16", "cuda") == ("bf16", "precision=bf16")
    assert runtime.resolve_precision("auto", "cuda") == ("bf16", "precision=auto on CUDA")
    assert runtime.resolve_precision("fp32", "cuda")[0] == "fp32"


def test_a_bad_precision_is_one_line_at_start_up(compose_config, mini_data):
    cfg = compose_config("train", ["experiment=smoke", f"data.path={mini_data}", "precision=fp16"])
    with pytest.raises(PosbenchError, match=r"^precision must be one of auto, fp32, bf16, got 'fp16'$"):
        check_config(cfg)


def first_two_losses(precision: str, corpus, attention: str) -> list[float]:
    """The loss before and after one AdamW step, from the same initialisation and batches."""
    torch.manual_seed(0)
    encoding = OmegaConf.structured(ENCODINGS["alibi"][0]())
    model_cfg = dataclasses.replace(SMALL, attention=attention)
    model = LanguageModel(model_cfg, encoding, corpus.vocab_size, 64, precision).train()
    optimizer = make_optimizer(model, OmegaConf.create({"lr": 1e-3, "weight_decay": 0.1}))
    gen, losses = torch.Generator().manual_seed(0), []
    for _ in range(2):
        x, y = sample_batch(corpus.splits["train"], 4, 64, gen)
        loss = model.token_nll(x, y).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights stay fp32
    return losses


@pytest.mark.parametrize("attention", ["sdpa", "eager"])  # eager: what auto trains with in bf16 on CPU
def test_a_bf16_training_step_is_within_one_percent_of_fp32(compose_config, mini_data, attention):
    corpus = load_corpus(compose_config("train", ["experiment=smoke", f"data.path={mini_data}"]).data)
    fp32, bf16 = first_two_losses("fp32", corpus, attention), first_two_losses("bf16", corpus, attention)
    assert bf16 != fp32  # bf16 did compute...
    assert bf16 == pytest.approx(fp32, rel=0.01)  # ...and moved the loss by less than 1%


def test_bf16_computes_the_head_in_bf16_and_the_loss_in_fp32():
    torch.manual_seed(0)
    model = LanguageModel(SMALL, OmegaConf.structured(ENCODINGS["rope"][0]()), 50, 16, "bf16")
    seen = {}
    model.head.register_forward_hook(lambda module, args, out: seen.update(head=out.dtype))
    nll = model.token_nll(torch.randint(0, 50, (2, 16)), torch.randint(0, 50, (2, 16)))
    assert seen["head"] == torch.bfloat16 and nll.dtype == torch.float32


def test_a_far_alibi_bias_is_not_rounded_to_bf16_in_sdpa():
    """Two keys 16,384 and 16,385 positions back: head 0's ALiBi biases -8192 and -8192.5 are one bf16 value
    (its step there is 64), so a bf16 mask would weight them equally instead of sigmoid(0.5) : sigmoid(-0.5)."""
    config = OmegaConf.structured(ENCODINGS["alibi"][0]())
    encoding = build_encoding(config, n_heads=8, head_dim=16, d_model=128, train_len=256)
    mask = causal_mask(encoding, torch.tensor([16385]), torch.tensor([0, 1]))  # (1, 8, 1, 2), fp32
    assert mask[0, 0, 0].tolist() == [-8192.5, -8192.0]
    q, k = torch.zeros(1, 8, 1, 16, dtype=torch.bfloat16), torch.zeros(1, 8, 2, 16, dtype=torch.bfloat16)
    v = torch.zeros(1, 8, 2, 16, dtype=torch.bfloat16)
    v[..., 0, 0] = 1  # output channel 0 = the weight of the farther key
    with torch.autocast("cpu", dtype=torch.bfloat16):
        farther = sdpa_attention(q, k, v, mask)[0, 0, 0, 0].item()
    assert farther == pytest.approx(torch.sigmoid(torch.tensor(-0.5)).item(), abs=2e-3)  # 0.3775, not 0.5


def test_precision_resumes_as_what_it_resolves_to(compose_config, mini_data, cpu_flags):
    cfg = compose_config("train", ["experiment=smoke", f"data.path={mini_data}", "device=cpu", "precision=auto"])
    saved = OmegaConf.to_container(cfg, resolve=True)
    before_the_key = {k: v for k, v in saved.items() if k != "precision"}  # a last.pt of CPU fp32 days
    cpu_flags()  # no native bf16: auto is fp32, what runs before the key computed in on CPU
    assert config_differences(before_the_key, cfg) == []
    cpu_flags("avx512_bf16")  # auto is bf16 now: another config than the fp32 run
    assert config_differences(before_the_key, cfg) == ["precision: fp32 -> bf16"]
    cfg.precision = "fp32"
    assert config_differences(before_the_key, cfg) == []
    assert config_differences(saved, cfg) == ["precision: bf16 -> fp32"]  # saved auto, resolved here: bf16


def test_auto_saved_where_it_was_bf16_is_another_precision_where_it_is_fp32(compose_config, mini_data, cpu_flags):
    """A checkpoint's ``precision`` says what its ``auto`` computed in on the machine that trained it."""
    cfg = compose_config("train", ["experiment=smoke", f"data.path={mini_data}", "device=cpu", "precision=auto"])
    saved = OmegaConf.to_container(cfg, resolve=True)
    cpu_flags()  # here auto is fp32
    assert config_differences(saved, cfg, saved_precision="bf16") == ["precision: bf16 -> fp32"]
    assert config_differences(saved, cfg, saved_precision="fp32") == []
    cpu_flags("avx512_bf16")  # here auto is bf16
    assert config_differences(saved, cfg, saved_precision="bf16") == []
    assert config_differences(saved, cfg, saved_precision="fp32") == ["precision: fp32 -> bf16"]


@pytest.mark.slow
def test_bf16_and_fp32_evaluation_of_a_trained_smoke_model_agree(compose_config, mini_data, tmp_path, caplog):
    cfg = compose_config(
        "train", ["experiment=smoke", f"data.path={mini_data}", "train.steps=30", "eval_lens=[32,128]"]
    )
    caplog.set_level("INFO")
    train(cfg, tmp_path)
    assert "fp32 (precision=fp32)" in caplog.text  # what was chosen and why, in the log
    register()
    for precision in ("fp32", "bf16"):
        command = compose_config("eval", [f"checkpoint={tmp_path}", f"precision={precision}"])
        evaluate_checkpoint(command, ["checkpoint", "precision"], tmp_path)
    results = pd.read_csv(tmp_path / "results.csv")
    assert list(results.columns)[-5:] == ["run_dir", "precision", "run_id", "model_step", "model_final"]
    ppl = results.set_index(["precision", "split", "eval_len"])["ppl"]
    assert len(ppl) == 8  # fp32 and bf16 rows side by side (the fp32 re-evaluation replaced training's own)
    for split in ("valid", "test"):
        for eval_len in (32, 128):
            assert ppl["bf16", split, eval_len] == pytest.approx(ppl["fp32", split, eval_len], rel=0.01)
            assert ppl["bf16", split, eval_len] != ppl["fp32", split, eval_len]


def write_results(folder, precision: str | None, ppl: float, seed: int = 0):
    """A run's results.csv at eval_len 4 and 8; ``precision=None``: written before the column existed."""
    folder.mkdir(parents=True)
    rows = [
        dict(encoding="rope", variant="", train_len=4, eval_len=n, split="test", eval_mode="nonoverlapping", stride=n)
        | dict(tokens=64, nll=0.0, ppl=ppl * n / 4, status="ok", seed=seed, run_dir=str(folder), precision=precision)
        for n in (4, 8)
    ]
    pd.DataFrame(rows).drop(columns=[] if precision else ["precision"]).to_csv(folder / "results.csv", index=False)


def test_the_report_groups_by_precision_and_names_it_only_when_there_are_several(tmp_path):
    from posbench.report import report

    write_results(tmp_path / "one" / "a", "fp32", 10.0, seed=0)
    write_results(tmp_path / "one" / "b", "fp32", 12.0, seed=1)
    single = (report(tmp_path / "one") / "summary.md").read_text()
    assert "| encoding | variant | train_len | 4 | 8 |" in single and "| rope |  | 4 | 11.0 ± 1.4 |" in single
    write_results(tmp_path / "two" / "a", "fp32", 10.0)
    write_results(tmp_path / "two" / "b", "bf16", 12.0)
    out = report(tmp_path / "two")
    summary = pd.read_csv(out / "summary.csv", keep_default_na=False).set_index(["precision", "eval_len"])
    assert summary.loc[("fp32", 4), "ppl_mean"] == 10.0 and summary.loc[("bf16", 4), "ppl_mean"] == 12.0
    text = (out / "summary.md").read_text()
    assert "| encoding | variant | train_len | precision | 4 | 8 |" in text
    assert "| rope |  | 4 | bf16 | 12.0 |" in text and "| rope |  | 4 | fp32 | 10.0 |" in text


def test_a_run_saved_before_the_key_is_evaluated_as_it_ran(compose_config, mini_data, tmp_path, cpu_flags):
    from posbench.checkpoint import CHECKPOINT, save_checkpoint

    cpu_flags("avx512_bf16")  # auto would be bf16 here; the old run computed in fp32 on CPU
    cfg = compose_config("train", ["experiment=smoke", f"data.path={mini_data}", "device=cpu"])
    corpus = load_corpus(cfg.data)
    model = LanguageModel(cfg.model, cfg.encoding, corpus.vocab_size, cfg.train_len)
    saved = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k != "precision"}
    save_checkpoint(tmp_path / CHECKPOINT, {"model": model.state_dict(), "config": saved, "vocab": corpus.vocab})
    register()

    def evaluated_in(*overrides: str) -> set[str]:
        command = compose_config("eval", [f"checkpoint={tmp_path}", "eval_lens=[32]", "eval.splits=[test]", *overrides])
        keys = ["checkpoint", "eval_lens", "eval.splits", *(o.split("=")[0] for o in overrides)]
        return set(evaluate_checkpoint(command, keys, tmp_path)["precision"])

    assert evaluated_in() == {"fp32"}
    assert evaluated_in("precision=auto") == {"bf16"}
