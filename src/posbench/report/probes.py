"""The probes' derived numbers per run (gain_beyond, effective_context, copy_reach, the window gap, attention
entropy) and their summary.md tables: mean ± std over seeds per (encoding, variant, train_len)."""

from __future__ import annotations

import math

import pandas as pd

from ..evaluate import variant_parts
from ..markdown import markdown_table
from ..probes.context import effective_context, gain_beyond
from ..probes.copy import MIN_COPY_GAIN, copy_reach
from ..probes.suite import ATTENTION_CSV, CONTEXT_CSV, COPY_CSV
from .collect import RESULTS, Run
from .tables import LINE, at_train_len_alone, line_key, trained_variant

#: The attention anatomy's eval lengths in the table, as multiples of train_len.
ANATOMY_MULTIPLES = (1, 4, 16)
#: The window gap is read at this multiple of train_len.
GAP_MULTIPLE = 16

#: An empty copy_reach where its gain was measured: no copying (copy_reach: None).
NO_COPYING = {"copy_reach": "gain_0", "copy_reach_vocab": "gain_0_vocab"}
#: summary.md's probe tables: title, what the numbers mean, and (column, header, digits) per cell.
TABLES = [
    (
        "Context usage",
        "nll of fixed test targets against the left context k: `gain_beyond` = nll(k = train_len) − nll(largest k) "
        "in nats (positive: context beyond the training length helps); `effective_context`: the smallest k within "
        "0.01 nats of the best.",
        [("gain_beyond", "gain_beyond (nats)", 4), ("effective_context", "effective_context", 0)],
    ),
    (
        "Window counterfactual",
        f"nll with attention limited to the last train_len keys minus the full model's, at {GAP_MULTIPLE} × "
        "train_len (test split, nats): about 0 means the model behaves as a sliding window.",
        [("window_gap", f"window gap at {GAP_MULTIPLE}× (nats)", 4)],
    ),
    (
        "Long-range copy",
        "`gain_0`: nll of a random span's second copy, right after the first, below the baseline's (nats); "
        "`copy_reach`: the largest distance whose gain is at least half of that, over the seeds that copy "
        f"(gain_0 ≥ {MIN_COPY_GAIN:g}; `no_copying` where none does); spans from every word, and (where a run "
        "has them) from the training split's `probe.vocab` most frequent words.",
        [
            ("gain_0", "gain at d = 0 (nats)", 3),
            ("copy_reach", "copy_reach (tokens)", 0),
            ("copy_vocab", "probe.vocab (words)", None),
            ("gain_0_vocab", "gain at d = 0, those words (nats)", 3),
            ("copy_reach_vocab", "copy_reach, those words (tokens)", 0),
        ],
    ),
    (
        "Attention anatomy",
        "Attention entropy (nats), mean over layers, heads and queries, at 1, 4 and 16 × train_len; the share of "
        "attention on keys more than train_len back, at 16 × train_len.",
        [*((f"entropy_{m}x", f"entropy {m}×", 2) for m in ANATOMY_MULTIPLES), ("mass_beyond", "mass beyond", 3)],
    ),
]


def as_trained(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of the model as trained (no evaluation-time variant), their variant how it was trained
    ("" read back as NaN; ``randpos8192``)."""
    variant = table["variant"].astype("string").fillna("").astype(str)
    return table[variant.map(lambda v: variant_parts(v)[1] == "")].assign(variant=variant)


def context_numbers(table: pd.DataFrame, train_len: int) -> dict:
    test = table[table["split"] == "test"]
    if test.empty or not (test["status"] == "ok").any():
        return {}
    return dict(gain_beyond=gain_beyond(test, train_len), effective_context=effective_context(test))


def copy_numbers(table: pd.DataFrame) -> dict:
    """gain_0 and copy_reach of the spans from every word; with a ``_vocab`` suffix, of those from the largest
    ``probe.vocab`` the run has rows of (``copy_vocab``)."""
    words = table.reindex(columns=["vocab"])["vocab"]
    numbers = reach_numbers(table[words.isna()], "")
    vocab, few = largest_vocab(table)
    if not math.isnan(vocab):
        numbers.update(reach_numbers(few, "_vocab"), copy_vocab=int(vocab))
    return numbers


def largest_vocab(table: pd.DataFrame) -> tuple[float, pd.DataFrame]:
    """The largest ``probe.vocab`` of a model's copy rows and those rows: the numbers reported with a ``_vocab``
    suffix; (NaN, the rows of spans from every word) where no row has a ``probe.vocab``."""
    words = table.reindex(columns=["vocab"])["vocab"]
    vocab = words.max()  # NaN where every row is of every word
    return (float("nan"), table[words.isna()]) if pd.isna(vocab) else (float(vocab), table[words == vocab])


def reach_numbers(table: pd.DataFrame, suffix: str) -> dict:
    ok = table[table["status"] == "ok"].set_index("distance")["gain"]
    if 0 not in ok.index:
        return {}
    reach = copy_reach(table).distance
    return {f"gain_0{suffix}": ok[0], f"copy_reach{suffix}": math.nan if reach is None else reach}


def window_numbers(results: pd.DataFrame, train_len: int) -> dict:
    if not {"variant", "nll"} <= set(results.columns):  # results.csv of a version without windows
        return {}
    # sliding-window rows of the same length (evaluated again later) are another measurement
    mode = results["eval_mode"] if "eval_mode" in results else "nonoverlapping"
    at = results[
        (results["split"] == "test") & (results["eval_len"] == GAP_MULTIPLE * train_len) & (mode == "nonoverlapping")
    ]
    at = at[at["status"] == "ok"]
    at = at.set_index(at["variant"].astype("string").fillna("").map(lambda v: variant_parts(v)[1]))["nll"]
    window = f"window{train_len}"
    return dict(window_gap=at[window] - at[""]) if {window, ""} <= set(at.index) else {}


def anatomy_numbers(table: pd.DataFrame, train_len: int) -> dict:
    ok = table[table["status"] == "ok"]
    numbers = {}
    for m in ANATOMY_MULTIPLES:
        at = ok[ok["eval_len"] == m * train_len]
        if not at.empty:
            numbers[f"entropy_{m}x"] = at["entropy"].mean()
    longest = ok[ok["eval_len"] == ANATOMY_MULTIPLES[-1] * train_len]
    if not longest.empty:
        numbers["mass_beyond"] = longest["mass_beyond_train_len"].mean()
    return numbers


def run_numbers(run: Run) -> dict:
    """The derived numbers of one run's probes (only those its CSVs allow)."""
    results = run.tables[RESULTS]
    first = results.iloc[0]
    train_len = int(first["train_len"])
    numbers = dict(encoding=first["encoding"], variant=trained_variant(results), train_len=train_len)
    numbers.update(seed=first.get("seed", 0))
    numbers.update(precision=run.precision, train_lengths=run.train_lengths, config=run.config)
    numbers.update(window_numbers(results, train_len))
    for name, derive in (
        (CONTEXT_CSV, lambda t: context_numbers(t, train_len)),
        (COPY_CSV, copy_numbers),
        (ATTENTION_CSV, lambda t: anatomy_numbers(t, train_len)),
    ):
        if name in run.tables:
            numbers.update(derive(as_trained(run.tables[name])))
    return numbers


def probe_numbers(runs: list[Run]) -> pd.DataFrame:
    """One row of derived numbers per run; no columns beyond the line's where no run has probes."""
    return pd.DataFrame([run_numbers(run) for run in runs])


def cell(values: pd.Series, digits: int | None) -> str:
    """Mean ± std over seeds; ``digits`` None: the distinct values, listed."""
    values = values.dropna()
    if values.empty:
        return ""
    if digits is None:
        return ", ".join(str(int(v)) for v in sorted(values.unique()))
    mean, std = values.mean(), values.std()
    return f"{mean:.{digits}f}" if pd.isna(std) else f"{mean:.{digits}f} ± {std:.{digits}f}"


def probe_markdown(numbers: pd.DataFrame) -> list[str]:
    """summary.md's sections, one per probe that some run has: a row per line, mean ± std over seeds."""
    sections = []
    for title, meaning, columns in TABLES:
        present = [c for c in columns if c[0] in numbers]
        if not present:
            continue
        named = dict(
            precision=numbers["precision"].astype(bool).any(),
            train_lengths=not at_train_len_alone(numbers).all(),
            config=numbers["config"].astype(bool).any(),
        )
        rows, line = [], [c for c in LINE if named.get(c, True)]  # one precision, no mixed lengths: unnamed
        for key, group in sorted(numbers.groupby(line), key=lambda item: line_key(item[0])):
            cells = {column: cell(group[column], digits) for column, _, digits in present}
            if any(cells.values()):
                for column, gain in NO_COPYING.items():
                    if column in cells and not cells[column] and cells.get(gain):
                        cells[column] = "no_copying"
                cells = list(cells.values())
                rows.append([*key, group["seed"].nunique(), *cells])
        header = [*line, "seeds", *(name for _, name, _ in present)]
        sections.append(f"## {title}\n\n{meaning}\n\n{markdown_table(header, rows)}")
    return sections
