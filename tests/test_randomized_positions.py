"""Randomized positions (encoding.randomized_positions=M; Ruoss et al., 2023) and the positions argument of the
seam: training samples positions, evaluation counts 0..L-1, and every encoding reads the positions it is given."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from posbench import attention as attention_mod
from posbench.attention import Attention
from posbench.masks import causal_mask
from posbench.positional import ENCODINGS, PositionEncoding, build_encoding, sample_positions
from posbench.train import train

VOCAB, T, B, M = 50, 24, 3, 64
BIAS = ["alibi", "kerple_log", "kerple_power", "t5"]  # biases of p_i - p_j alone (FIRE also reads p_i)


def random_positions(seed: int = 0, limit: int = 1000, rows: int = B) -> torch.Tensor:
    return sample_positions(rows, T, limit, generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def tokens():
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(1))


def test_sampled_positions_are_sorted_distinct_and_below_m():
    positions = sample_positions(2000, T, M, generator=torch.Generator().manual_seed(0))
    assert positions.shape == (2000, T) and positions.dtype == torch.long
    assert (positions.diff(dim=-1) > 0).all()  # increasing: sorted and distinct
    assert positions.min() == 0 and positions.max() == M - 1
    # A uniform subset: each position is drawn with probability T/M (0.375 here).
    frequency = torch.bincount(positions.flatten(), minlength=M) / 2000
    assert frequency.sub(T / M).abs().max() < 0.05


def test_training_samples_positions_from_the_seeded_rng_and_evaluation_counts(tiny_lm, tokens):
    plain = tiny_lm("rope", vocab=VOCAB, train_len=T)
    randomized = tiny_lm("rope", vocab=VOCAB, train_len=T, options={"randomized_positions": M})
    torch.manual_seed(7)
    trained = randomized.train()(tokens)
    torch.manual_seed(7)
    drawn = sample_positions(B, T, M)
    assert not torch.equal(drawn, torch.arange(T).expand(B, T))
    torch.testing.assert_close(trained, plain(tokens, drawn), rtol=0, atol=0)

    randomized.eval()
    assert torch.equal(randomized.encoding.positions(B, 100), torch.arange(100))
    with torch.no_grad():
        torch.testing.assert_close(randomized(tokens), plain.eval()(tokens), rtol=0, atol=0)


def test_a_learned_table_of_m_rows_serves_lengths_up_to_m(tiny_lm, tokens):
    model = tiny_lm("learned", vocab=VOCAB, train_len=T, options={"randomized_positions": M})
    assert model.encoding.table.weight.shape == (M, 32)
    assert model.encoding.unsupported_reason(M) is None and str(M) in model.encoding.unsupported_reason(M + 1)
    model.train().token_nll(tokens, tokens).mean().backward()
    trained_rows = model.encoding.table.weight.grad.abs().sum(dim=1) > 0
    assert trained_rows[T:].any()  # training reaches positions past train_len
    long = torch.randint(0, VOCAB, (1, M))
    with torch.no_grad():
        hidden = model.eval()(long)
        embedded = model.encoding.embed(torch.zeros(1, M, 32), torch.arange(M))
    assert torch.isfinite(hidden).all()
    torch.testing.assert_close(embedded[0], model.encoding.table.weight)


def test_m_below_train_len_is_one_line(posbench, assert_one_line):
    done = posbench("train", "experiment=smoke", "encoding=rope", "encoding.randomized_positions=16")
    assert_one_line(done, "encoding=rope", "encoding.randomized_positions", "train_len=32", "got 16")


def test_a_learned_table_smaller_than_m_is_refused():
    with pytest.raises(ValueError, match="encoding.max_positions=32 must be at least encoding.randomized_positions=64"):
        cfg = {"name": "learned", "max_positions": 32, "randomized_positions": 64}
        build_encoding(cfg, n_heads=4, head_dim=8, d_model=32, train_len=16)


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_randomized_positions_warn_exactly_where_they_change_nothing(tiny_lm, tokens, caplog, name):
    """An encoding whose outputs do not move when its positions do (NoPE, FoX, stick-breaking, CoPE) accepts
    randomized_positions, as a control run, with one warning; every other encoding reads them, silently."""
    model = tiny_lm(name, vocab=VOCAB, train_len=T, encoding_noise=0.3, attention="auto")
    with torch.no_grad():
        # other positions below T (a learned table has T rows): every distance halved
        moved = not torch.equal(model(tokens), model(tokens, torch.arange(T) // 2))
    with caplog.at_level("WARNING", logger="posbench.positional"):
        tiny_lm(name, vocab=VOCAB, train_len=T, attention="auto")
        assert not caplog.records
        tiny_lm(name, vocab=VOCAB, train_len=T, attention="auto", options={"randomized_positions": M})
    warned = f"encoding={name} has no positions" in caplog.text and f"randomized_positions={M} changes" in caplog.text
    assert warned == (not moved) and len(caplog.records) == (not moved)
    assert moved or name in {"none", "fox", "stickbreaking", "cope"}


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_positions_0_to_t_minus_1_given_explicitly_change_nothing(tiny_lm, tokens, name):
    """The seam refactor is pure: 0..T-1 given as a tensor of its own, or as a row per sequence (another mask,
    other tables), give the output the model computes by itself, forward and backward."""
    model = tiny_lm(name, vocab=VOCAB, train_len=T, encoding_noise=0.3)
    counting = torch.arange(T)
    outputs = []
    for positions in (None, counting.clone(), counting.expand(B, T)):
        model.zero_grad()
        hidden = model(tokens, positions)
        hidden.square().mean().backward()
        outputs.append([hidden.detach()] + [p.grad.clone() for p in model.parameters() if p.grad is not None])
    for default, explicit, per_row in zip(*outputs):
        torch.testing.assert_close(explicit, default, rtol=0, atol=0)
        torch.testing.assert_close(per_row, default, rtol=1e-5, atol=1e-6)


def reads_positions(encoding: PositionEncoding) -> bool:
    """Whether the encoding overrides a call that is given the positions (NoPE, FoX and stick-breaking do not)."""
    return any(getattr(type(encoding), call) is not getattr(PositionEncoding, call) for call in POSITIONED_CALLS)


POSITIONED_CALLS = ("embed", "rotate", "bias_at")


@pytest.mark.parametrize("name", sorted(ENCODINGS))
@pytest.mark.parametrize("backend", ["eager", "sdpa", "query blocks"])
def test_each_sequence_gets_its_own_positions(tiny_lm, tokens, name, backend, monkeypatch):
    """A batch at per-sequence positions (B, T) equals each sequence run alone at its row (T,)."""
    options = {"randomized_positions": M}  # learned: a table of M rows
    backend_name = "eager" if backend == "query blocks" else backend
    model = tiny_lm(name, vocab=VOCAB, train_len=T, encoding_noise=0.3, options=options, attention=backend_name)
    if backend == "query blocks":  # the mask of every sequence, 5 queries at a time
        factor = model.encoding.logit_memory_factor if model.encoding.has_layer_terms else 1
        monkeypatch.setattr(attention_mod, "MASK_BUDGET", int(4 * B * model.encoding.n_heads * T * 5 * factor))
    positions = random_positions(limit=M)
    with torch.no_grad():
        together = model.eval()(tokens, positions)
        for b in range(B):
            torch.testing.assert_close(together[b], model(tokens[b : b + 1], positions[b])[0], rtol=1e-5, atol=1e-5)
        assert not torch.allclose(together, model(tokens)) or not reads_positions(model.encoding)


@pytest.mark.parametrize("name", BIAS)
def test_a_bias_is_unchanged_when_every_position_shifts(name):
    encoding = build_encoding({"name": name}, n_heads=4, head_dim=8, d_model=32, train_len=16)
    with torch.no_grad():
        for p in encoding.parameters():
            p.add_(0.3 * torch.randn_like(p))
    index, positions = torch.arange(T), random_positions()
    mask = causal_mask(encoding, index, index, positions=positions)  # (B, H, T, T)
    torch.testing.assert_close(mask, causal_mask(encoding, index, index, positions=positions + 4321), rtol=0, atol=0)
    assert not torch.equal(mask, causal_mask(encoding, index, index).expand_as(mask))  # the positions matter
    i, j = positions[1, 20], positions[1, 3]  # one entry by hand: the bias of positions, not of indices
    expected = encoding.bias_at(torch.tensor(2), i, j)
    torch.testing.assert_close(mask[1, 2, 20, 3], expected.float())


def test_fire_reads_the_query_position_itself():
    """FIRE normalises by ψ(max(L, p_i)): shifting every position changes the bias past the threshold L."""
    encoding = build_encoding({"name": "fire", "init_threshold": 4.0}, n_heads=4, head_dim=8, d_model=32, train_len=16)
    index, positions = torch.arange(T), random_positions()
    with torch.no_grad():
        mask = causal_mask(encoding, index, index, positions=positions)
        shifted = causal_mask(encoding, index, index, positions=positions + 500)
    hidden = mask.isinf()
    assert not torch.allclose(mask[~hidden], shifted[~hidden])
    c = encoding.c.item()  # ψ(p_i − p_j) / ψ(max(L, p_i)), fed to the MLP
    i, j = positions[0, 10].item(), positions[0, 2].item()
    x = math.log1p(c * (i - j)) / (math.log1p(c * max(4.0, i)) + 1e-6)
    with torch.no_grad():
        hidden_units = torch.relu(x * encoding.w1 + encoding.b1)
        torch.testing.assert_close(mask[0, :, 10, 2], encoding.w2 @ hidden_units + encoding.b2)


def test_sinusoidal_embedding_at_position_p_is_the_closed_form():
    d = 8
    encoding = build_encoding({"name": "sinusoidal"}, n_heads=2, head_dim=4, d_model=d, train_len=16)
    positions = torch.tensor([[3, 17, 1000], [0, 5, 4095]])
    embedded = encoding.embed(torch.zeros(2, 3, d), positions)
    expected = [
        [[f(p / 10000 ** (2 * (k // 2) / d)) for k, f in zip(range(d), [math.sin, math.cos] * (d // 2))] for p in row]
        for row in positions.tolist()
    ]
    torch.testing.assert_close(embedded, torch.tensor(expected), rtol=0, atol=1e-4)  # fp32 p / 10000^(2i/d)


def test_rope_rotates_each_sequence_by_its_positions():
    """Rotation pair (i, i + d/2) at position p turns by p·θ^(−2i/d): the complex-number form, written out."""
    head_dim, theta = 8, 10000.0
    encoding = build_encoding({"name": "rope"}, n_heads=2, head_dim=head_dim, d_model=16, train_len=16)
    q = torch.randn(B, 2, T, head_dim)
    positions = random_positions(limit=200)
    rotated, _ = encoding.rotate(q, q, positions)
    frequencies = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = positions[:, None, :, None].double() * frequencies  # (B, 1, T, d/2)
    turn = torch.polar(torch.ones_like(angles), angles)
    pairs = torch.complex(q[..., : head_dim // 2].double(), q[..., head_dim // 2 :].double()) * turn
    expected = torch.cat((pairs.real, pairs.imag), dim=-1).float()
    torch.testing.assert_close(rotated, expected, rtol=1e-4, atol=1e-4)  # fp32 angles up to 200 rad


@pytest.mark.parametrize("name", ["rope", "xpos"])
def test_rotary_logits_depend_on_position_differences(name):
    encoding = build_encoding({"name": name}, n_heads=2, head_dim=8, d_model=16, train_len=16)
    q, k = torch.randn(2, B, 2, T, 8).unbind(0)
    positions = random_positions(limit=200)

    def logits(at):
        rq, rk = encoding.rotate(q, k, at)
        return rq @ rk.transpose(-2, -1)

    torch.testing.assert_close(logits(positions + 100), logits(positions), rtol=1e-3, atol=1e-3)
    assert not torch.allclose(logits(positions), logits(torch.arange(T)), rtol=1e-3, atol=1e-3)


def test_flex_biases_each_sequence_by_its_positions():
    """FlexAttention looks the positions up by batch row (padded to whole blocks), as the dense mask does."""
    encoding = build_encoding({"name": "alibi"}, n_heads=4, head_dim=8, d_model=32, train_len=16)
    flex, eager = Attention("flex", encoding), Attention("eager", encoding)
    q, k, v = torch.randn(3, B, 4, T, 8).unbind(0)
    positions = random_positions()
    with torch.no_grad():
        got = flex(q, k, v, flex.plan(T, q.device, False, 0.0, positions))
        expected = eager(q, k, v, eager.plan(T, q.device, False, 0.0, positions))
    assert not flex.flex_broken
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_a_smoke_training_with_randomized_positions_runs(compose_config, mini_data, tmp_path, name):
    overrides = ["experiment=smoke", f"encoding={name}", "encoding.randomized_positions=1024", f"data.path={mini_data}"]
    overrides += ["train.steps=2", "train.eval_every=2", "train.val_tokens=128", "eval.splits=[valid]"]
    overrides += ["eval.max_tokens=256", "eval_lens=[64]", "device=cpu"]
    results = train(compose_config("train", overrides), tmp_path)["results"]
    assert list(results["status"]) == ["ok"] and results["ppl"].map(math.isfinite).all()
    assert pd.read_csv(tmp_path / "train_log.csv")["train_loss"].map(math.isfinite).all()
