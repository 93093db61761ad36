"""A pre-LayerNorm decoder-only Transformer LM whose position encoding is pluggable.

The model talks to its encoding through three calls (see ``positional/base.py``), each given the
tokens' positions: ``embed`` on the token embeddings; ``rotate`` on q/k and ``bias`` in the attention
(``attention.py``), which every layer shares and which turns the bias into one mask per pass. An encoding
that reads the tokens also gives each layer its own ``LayerTerms`` (``layer_terms``), held by that layer.
The encoding initialises its own parameters; the model's GPT-2 initialisation covers only its own layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import Attention, Plan, attention_problems
from .cache import KVCache, LayerCache
from .errors import raise_problems
from .positional import Dimensions, LayerTerms, build_encoding, encoding_problems
from .runtime import autocast
from .variant import AttentionVariant


@dataclass
class ModelConfig:
    name: str = "paper"
    n_layers: int = 6
    d_model: int = 256
    n_heads: int = 8
    d_ff: int = 512
    dropout: float = 0.1
    #: Dropout on the attention weights (``null``: ``dropout``). Above 0, SDPA on CPU leaves its
    #: fused kernel for the math path (full score matrix; docs/performance.md) and flex cannot run.
    attn_dropout: Optional[float] = None
    #: Share the token embedding with the output projection.
    tie_weights: bool = True
    #: Positions per chunk when computing the LM head and loss (bounds logits memory:
    #: 2048 x 33,278 fp32 logits and their log-softmax are 0.5 GB).
    loss_chunk: int = 2048
    #: Attention backend: sdpa | flex | eager | auto (see attention.py and the README).
    attention: str = "auto"
    #: Compile the Transformer blocks with torch.compile (state-dict keys stay unchanged).
    compile: bool = False
    #: Log-n attention scaling (``variant.logn_factors``): queries at positions past the training
    #: length scaled by log(n + 1) / log(train_len); training itself is unchanged.
    logn_scaling: bool = False


def model_problems(cfg: ModelConfig) -> list[str]:
    """The rules of a model config that its types cannot express (the backend's: ``attention_problems``)."""
    sizes = {key: getattr(cfg, key) for key in ("n_layers", "d_model", "n_heads", "d_ff")}
    found = [f"model.{key} must be positive, got {value}" for key, value in sizes.items() if value < 1]
    if cfg.n_heads >= 1 and cfg.d_model % cfg.n_heads:
        found.append(f"model.d_model={cfg.d_model} is not divisible by model.n_heads={cfg.n_heads}")
    if not 0 <= cfg.dropout < 1:
        found.append(f"model.dropout must be in [0, 1), got {cfg.dropout}")
    if cfg.attn_dropout is not None and not 0 <= cfg.attn_dropout <= 1:
        found.append(f"model.attn_dropout must be in [0, 1] or null, got {cfg.attn_dropout}")
    return found


def build_problems(cfg: ModelConfig, encoding_cfg, train_len: int) -> list[str]:
    """Every problem ``LanguageModel(cfg, encoding_cfg, ..., train_len)`` would raise, found without building it:
    the model's own, its attention's and its encoding's (``encoding=NAME: ...``)."""
    found = model_problems(cfg) + attention_problems(cfg.attention, train_len if cfg.logn_scaling else None)
    whole = cfg.n_heads >= 1 and cfg.d_model % cfg.n_heads == 0
    # Head size 0 while d_model / n_heads is no whole number: that is the model's problem, said once above,
    # and no encoding rule finds fault with it.
    dims = Dimensions(cfg.n_heads, cfg.d_model // cfg.n_heads if whole else 0, cfg.d_model, train_len)
    name = encoding_cfg["name"] if isinstance(encoding_cfg, dict) else encoding_cfg.name
    return found + [f"encoding={name}: {problem}" for problem in encoding_problems(encoding_cfg, dims)]


class SelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, attention: Attention):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.attention = attention  # shared by every layer; not a module, so no state-dict keys
        # This layer's content terms: a module (state-dict keys ``terms.*``) only for encodings that have them.
        self.terms = attention.encoding.layer_terms()

    def forward(self, x: Tensor, plan: Plan, cache: LayerCache | None = None) -> Tensor:
        B, T, C = x.shape
        qkv = self.qkv(x).view(B, T, 3, self.n_heads, C // self.n_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # (B, H, T, hd) each
        state = None if self.terms is None else self.terms.prepare(x)  # (B, H, T) or None
        y = self.attention(q, k, v, plan, cache, self.terms, state)  # (B, H, T, hd)
        return self.resid_dropout(self.proj(y.transpose(1, 2).reshape(B, T, C)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, attention: Attention):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.attn = SelfAttention(cfg, attention)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, cfg.d_ff), nn.GELU(), nn.Linear(cfg.d_ff, cfg.d_model), nn.Dropout(cfg.dropout)
        )

    def forward(self, x: Tensor, plan: Plan, cache: LayerCache | None = None) -> Tensor:
        x = x + self.attn(self.ln1(x), plan, cache)
        return x + self.mlp(self.ln2(x))


class LanguageModel(nn.Module):
    """``precision`` (``fp32`` or ``bf16``, resolved: runtime.resolve_precision) is how ``token_nll`` computes."""

    def __init__(self, cfg: ModelConfig, encoding_cfg, vocab_size: int, train_len: int, precision: str = "fp32"):
        super().__init__()
        raise_problems(model_problems(cfg))
        self.cfg, self.precision = cfg, precision
        head_dim = cfg.d_model // cfg.n_heads
        self.encoding = build_encoding(
            encoding_cfg, n_heads=cfg.n_heads, head_dim=head_dim, d_model=cfg.d_model, train_len=train_len
        )
        self.attention = Attention(cfg.attention, self.encoding, train_len, AttentionVariant(logn=cfg.logn_scaling))
        self.tok_emb = nn.Embedding(vocab_size, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, self.attention) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, vocab_size, bias=False)
        self.reset_parameters()
        if cfg.tie_weights:
            self.head.weight = self.tok_emb.weight
        if cfg.compile:  # per block, in place: state-dict keys keep no `_orig_mod.` prefix
            for block in self.blocks:
                block.compile()

    def reset_parameters(self) -> None:
        """GPT-2's initialisation of the model's own layers; the encoding initialises its own, and the layers'
        content terms theirs (``LayerTerms.reset_parameters``)."""
        self.encoding.reset_parameters()  # first: the encoding is the first child, so draws keep their order
        for child in self.children():
            if child is not self.encoding:
                child.apply(self._init_weights)
        for block in self.blocks:  # GPT-2: residual projections scaled by depth
            for weight in (block.attn.proj.weight, block.mlp[2].weight):
                nn.init.normal_(weight, std=0.02 / math.sqrt(2 * self.cfg.n_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, LayerTerms):  # ``apply`` reaches it after its children: its own rule wins
            module.reset_parameters()

    @property
    def attn_dropout(self) -> float:
        """Dropout on the attention weights in training."""
        return self.cfg.dropout if self.cfg.attn_dropout is None else self.cfg.attn_dropout

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def encoding_parameters(self) -> list[nn.Parameter]:
        """The encoding's own parameters and those of every layer's content terms."""
        terms = [block.attn.terms for block in self.blocks if block.attn.terms is not None]
        return [*self.encoding.parameters(), *(p for t in terms for p in t.parameters())]

    def forward(self, idx: Tensor, positions: Tensor | None = None, cache: KVCache | None = None) -> Tensor:
        """idx (B, T) token ids at ``positions`` (T,) or (B, T) -> final hidden states (B, T, D).

        ``positions=None``: the encoding's (``PositionEncoding.positions``): 0..T-1, or in training with
        ``encoding.randomized_positions`` a random sample per sequence. With a key/value ``cache`` (``cache.py``;
        inference only), the tokens follow those in it, at the positions after theirs, and join it.
        """
        if cache is not None:
            return self.decode(idx, cache)
        if positions is None:
            positions = self.encoding.positions(*idx.shape, device=idx.device)
        x = self.drop(self.encoding.embed(self.tok_emb(idx), positions))
        dropout_p = self.attn_dropout if self.training else 0.0
        plan = self.attention.plan(idx.shape[1], idx.device, torch.is_grad_enabled(), dropout_p, positions, len(idx))
        for block in self.blocks:  # one plan for every layer
            x = block(x, plan)
        return self.ln_f(x)

    def decode(self, idx: Tensor, cache: KVCache) -> Tensor:
        """``forward`` of tokens idx (B, T) that follow the ``cache.length`` tokens in ``cache``."""
        plan = self.attention.decoding_plan(cache.length, idx.shape[1], idx.device, len(idx))  # positions: the tokens'
        x = self.encoding.embed(self.tok_emb(idx), plan.positions)
        for block, layer_cache in zip(self.blocks, cache.layers):
            x = block(x, plan, layer_cache)
        return self.ln_f(x)

    def new_cache(self, capacity: int) -> KVCache:
        """An empty key/value cache for sequences of at most ``capacity`` tokens."""
        return KVCache(self.cfg.n_layers, capacity)

    def token_nll(self, idx: Tensor, targets: Tensor) -> Tensor:
        """Per-token negative log-likelihood (B, T) of ``targets`` given ``idx``.

        The LM head and log-softmax run over chunks of positions, so long sequences never
        hold the full (B, T, vocab) logits at once. In bf16 the blocks and the head's product run
        under autocast; the log-softmax and the loss take the logits in fp32.
        """
        with autocast(idx.device, self.precision):
            h = self(idx)
        chunk = max(1, self.cfg.loss_chunk // idx.shape[0])
        nll = []
        for s in range(0, idx.shape[1], chunk):
            with autocast(idx.device, self.precision):
                logits = self.head(h[:, s : s + chunk])
            nll.append(  # flattened (N, V) logits: the (B, V, T) layout takes a slow path
                F.cross_entropy(logits.float().flatten(0, 1), targets[:, s : s + chunk].flatten(), reduction="none")
            )
        return torch.cat([n.view(idx.shape[0], -1) for n in nll], dim=1)
