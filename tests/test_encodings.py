"""The encoding seam: one construction interface, rules checked where things are built, declared
evaluation-time variants, each encoding's own initialisation, the attention's rotation."""

import inspect
import math
from dataclasses import dataclass, replace

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from posbench.attention import Attention
from posbench.backends import eager_attention
from posbench.commands.eval import schema as eval_schema
from posbench.config import Config, EvalConfig
from posbench.errors import PosbenchError
from posbench.evaluate import variant_of, variant_parts
from posbench.masks import causal_mask
from posbench.model import LanguageModel, ModelConfig
from posbench.positional import ENCODINGS, EncodingConfig, PositionEncoding, build_encoding, rotate_pairs
from posbench.saved_run import run_config

TINY = ModelConfig(name="tiny", n_layers=2, d_model=32, n_heads=4, d_ff=64, dropout=0.0, attention="sdpa")


def make(name: str, **options) -> PositionEncoding:
    return build_encoding({"name": name, **options}, n_heads=4, head_dim=8, d_model=32, train_len=16)


@dataclass
class ToyConfig(EncodingConfig):
    name: str = "toy"
    stretch: float = 1.0


@dataclass
class ToyVariant:
    stretch: float = 1.0


class Toy(PositionEncoding):
    """A third-party encoding: a torch layer with its own initialisation, and one evaluation-time option."""

    variant_options = ToyVariant

    def __init__(self, cfg: ToyConfig, dims):
        super().__init__(cfg, dims)
        self.mix = nn.Linear(dims.d_model, dims.d_model)

    @classmethod
    def variant_label(cls, cfg: ToyConfig) -> str:
        return "" if cfg.stretch == 1 else f"stretch×{cfg.stretch:g}"

    def embed(self, x, positions):
        return x + self.mix(x)


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(ENCODINGS, "toy", (ToyConfig, Toy))


@pytest.mark.parametrize("name", list(ENCODINGS))
def test_every_encoding_is_built_from_its_config_and_the_model_dimensions_only(name):
    assert list(inspect.signature(ENCODINGS[name][1]).parameters) == ["cfg", "dims"]


def test_an_unknown_option_is_refused_naming_the_key():
    with pytest.raises(ValueError, match=r"encoding\.thetaa is not an option of encoding=rope"):
        make("rope", thetaa=10.0)
    with pytest.raises(ValueError, match=r"encoding\.scaling\.facter is not an option"):
        make("rope", scaling={"facter": 2.0})
    with pytest.raises(ValueError, match=r"encoding\.name must be one of alibi, .*rope.*, got 'ropes'"):
        make("ropes")


@pytest.mark.parametrize(
    "name, options, key",
    [
        ("rope", {"theta": 0.0}, "theta"),
        ("rope", {"theta": -10000.0}, "theta"),
        ("xpos", {"theta": 0.0}, "theta"),
        ("xpos", {"scale_base": 0.0}, "scale_base"),
        ("rope", {"layout": "pairs"}, "layout"),
        ("rope", {"scaling": {"type": "linear", "factor": 0.5}}, "scaling.factor"),
        ("t5", {"num_buckets": 1}, "num_buckets"),
        ("t5", {"max_distance": 16}, "max_distance"),
        ("fire", {"mlp_width": 0}, "mlp_width"),
        ("fire", {"init_c": -0.1}, "init_c"),
        ("fire", {"init_threshold": 0.0}, "init_threshold"),
        ("learned", {"max_positions": 0}, "max_positions"),
    ],
)
def test_a_bad_option_fails_at_construction_naming_the_key(name, options, key):
    with pytest.raises(ValueError, match=rf"encoding\.{key}"):
        make(name, **options)


@pytest.mark.parametrize("name", ["rope", "xpos"])
def test_rotary_encodings_share_the_head_size_rule(name):
    with pytest.raises(ValueError, match=r"even head dimension \(model.d_model / model.n_heads\), got 7"):
        build_encoding({"name": name}, n_heads=2, head_dim=7, d_model=14, train_len=16)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"n_layers": 0}, "model.n_layers must be positive, got 0"),
        ({"d_ff": -1}, "model.d_ff must be positive"),
        ({"n_heads": 0}, "model.n_heads must be positive"),
        ({"n_heads": 5}, "model.d_model=32 is not divisible by model.n_heads=5"),
        ({"dropout": 1.0}, r"model.dropout must be in \[0, 1\), got 1.0"),
        ({"dropout": -0.1}, "model.dropout must be in"),
        ({"attn_dropout": 1.5}, "model.attn_dropout must be in"),
        ({"attention": "fash"}, "model.attention must be one of auto, sdpa, flex, eager, got 'fash'"),
    ],
)
def test_model_rules_are_checked_where_the_model_is_built(change, message):
    with pytest.raises(ValueError, match=message):
        LanguageModel(replace(TINY, **change), {"name": "none"}, 50, 16)


def test_rotate_pairs_is_a_complex_rotation_in_both_layouts():
    x, angles = torch.randn(3, 8, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    turn = torch.polar(torch.ones_like(angles), angles)  # e^{i·angle}
    interleaved = torch.view_as_real(torch.view_as_complex(x.view(3, 4, 2).contiguous()) * turn).flatten(-2)
    half = torch.complex(x[:, :4], x[:, 4:]) * turn  # pairs (i, i + d/2)
    cos, sin = angles.cos(), angles.sin()
    torch.testing.assert_close(rotate_pairs(x, cos, sin, interleaved=True), interleaved)
    torch.testing.assert_close(rotate_pairs(x, cos, sin), torch.cat((half.real, half.imag), dim=-1))


def test_the_attention_rotates_queries_and_keys_with_its_encoding():
    rope = make("rope")
    attention = Attention("eager", rope)
    q, k, v = torch.randn(3, 1, 4, 6, 8).unbind(0)  # (B, H, T, hd) each
    pos = torch.arange(6)
    expected = eager_attention(*rope.rotate(q, k, pos), v, causal_mask(rope, pos, pos))
    torch.testing.assert_close(attention(q, k, v, attention.plan(6, q.device, False, 0.0)), expected)


@pytest.mark.parametrize("name", ["toy", "fire", "t5", "kerple_log", "kerple_power"])
def test_the_model_leaves_an_encodings_own_initialisation_alone(name, toy):
    """The encoding is built first, so alone and inside the model it draws the same numbers."""
    torch.manual_seed(0)
    alone = make(name).state_dict()
    torch.manual_seed(0)
    inside = LanguageModel(TINY, {"name": name}, 50, 16).encoding.state_dict()
    assert alone.keys() == inside.keys()
    for key in alone:
        torch.testing.assert_close(inside[key], alone[key], rtol=0, atol=0, msg=key)


def test_a_learned_position_table_starts_like_the_token_embedding():
    torch.manual_seed(0)
    model = LanguageModel(replace(TINY, d_model=64), {"name": "learned", "max_positions": 256}, 50, 16)
    table = model.encoding.table.weight
    assert table.shape == (256, 64) and abs(table.std().item() - 0.02) < 0.001 and abs(table.mean().item()) < 0.001


def test_variant_of_names_rope_scaling():
    assert variant_of(OmegaConf.create({"name": "rope"})) == ""
    assert variant_of(OmegaConf.create({"name": "rope", "scaling": {"type": "yarn", "factor": 4}})) == "yarn×4"
    assert variant_of(OmegaConf.create({"name": "alibi"})) == ""


def test_randomized_positions_are_part_of_the_variant_and_say_how_the_model_was_trained():
    rope = OmegaConf.create({"name": "rope", "randomized_positions": 8192})
    assert variant_of(rope) == "randpos8192"
    assert variant_of(OmegaConf.create({"name": "learned", "randomized_positions": 512})) == "randpos512"
    yarn = OmegaConf.merge(rope, {"scaling": {"type": "yarn", "factor": 4}})
    evaluated = OmegaConf.structured(EvalConfig(window=256, attn_temperature=1.5))
    variant = variant_of(yarn, evaluated, OmegaConf.create({"logn_scaling": True}))
    assert variant == "randpos8192+yarn×4+logn+window256+temp1.5"
    assert variant_parts(variant) == ("randpos8192", "yarn×4+logn+window256+temp1.5")
    assert variant_parts("randpos8192") == ("randpos8192", "") and variant_parts("") == ("", "")
    assert variant_parts("window256") == ("", "window256")


def saved_config(encoding: str):
    return OmegaConf.merge(OmegaConf.structured(Config), {"encoding": {"name": encoding}})


def command(**namespaces):
    return OmegaConf.merge(OmegaConf.structured(eval_schema()), {"checkpoint": "run", **namespaces})


def test_a_new_encodings_variant_options_reach_the_eval_command_and_result_rows(toy):
    assert variant_of(OmegaConf.create({"name": "toy"})) == ""
    schema = OmegaConf.structured(eval_schema())
    assert schema.toy.stretch == 1.0 and schema.rope.scaling.type is None
    cfg = run_config(saved_config("toy"), command(toy={"stretch": 3.0}), ["checkpoint", "toy.stretch"])
    assert cfg.encoding.stretch == 3.0 and variant_of(cfg.encoding) == "stretch×3"
    with pytest.raises(PosbenchError, match="rope.scaling.type applies to runs of encoding=rope; this run is toy"):
        run_config(saved_config("toy"), command(rope={"scaling": {"type": "linear"}}), ["rope.scaling.type"])


def test_rope_scaling_on_the_eval_command_becomes_the_encodings_scaling():
    overrides = command(rope={"scaling": {"type": "linear", "factor": 4.0}})
    cfg = run_config(saved_config("rope"), overrides, ["rope.scaling.type", "rope.scaling.factor"])
    assert cfg.encoding.scaling.type == "linear" and variant_of(cfg.encoding) == "linear×4"
    assert math.isclose(cfg.encoding.theta, 10000.0)
