"""``python -m posbench COMMAND ...``: dispatch a command word, turn bad input into one line and exit 2.

``COMMANDS`` is the table: each word names a module of ``posbench.commands`` (see its docstring for their
shape) and the line ``--help`` shows for it. Hydra parses everything after the command word, so
``python -m posbench -m train encoding=alibi,rope`` and ``python -m posbench train -m encoding=alibi,rope``
both sweep.
"""

from __future__ import annotations

import sys

from .errors import fail, one_line_errors, outlive_closed_pipes

#: Every command, in the order ``--help`` lists them, with what it says of each.
COMMANDS = {
    "train": """train one LM and write perplexity at every evaluation length
(Hydra overrides, e.g. encoding=rope experiment=quick data.path=DIR;
-m sweeps comma-separated values; `train --help` shows the config groups;
task=passkey|mqar|copy trains on a synthetic retrieval task instead, docs/tasks.md)""",
    "eval": """evaluate a saved run again without retraining: checkpoint=PATH 'eval_lens=[...]'
eval.mode=sliding eval.stride=S, rope.scaling.type=linear|ntk|dynamic|yarn rope.scaling.factor=F""",
    "probe": """does a saved run read its context? checkpoint=PATH 'probes=[context,window,copy,attention]'
(the default: all four; docs/probes.md), probe.targets=N probe.trials=N eval.window=W""",
    "generate": """sample past the training length from a saved run, with a key/value cache: checkpoint=PATH
generate.prompts=N generate.max_len=L generate.temperature=T generate.top_k=K generate.top_p=P
(samples.jsonl, generation.csv: repetition, distinct-2, NLL per window; docs/generation.md)""",
    "report": """DIR: tables (summary.md, summary.csv: mean ± std over seeds) and figures (ppl_vs_length,
per_position_loss, training_curves; PNG and SVG) from every run below DIR;
DIR compare=ENCODING adds compare.csv: NLL differences against ENCODING with bootstrap CIs;
variants=LIST and modes=LIST keep only those evaluations (e.g. variants=window256 modes=nonoverlapping)""",
    "bench": "speed and memory of every encoding x attention backend (bench.csv, bench.md)",
}


def usage() -> str:
    lines = [
        "usage: python -m posbench [-m] COMMAND [ARGS...]",
        "",
        "Which position encoding lets a Transformer LM read past its training length?",
        "",
        "commands:",
    ]
    for name, text in COMMANDS.items():
        first, *rest = text.splitlines()
        lines += [f"  {name:<8} {first}", *(f"           {line}" for line in rest)]
    return "\n".join([*lines, "", "Run `python -m posbench COMMAND --help` for a command's options.", ""])


def run_command(name: str, args: list[str]) -> int:
    """A command that reads words of its own (it has ``parse``: report) runs here; the others read Hydra overrides
    and run through ``commands.launch``."""
    from .commands import command

    module = command(name)
    if not hasattr(module, "parse"):
        from .commands.launch import launch

        return launch(name, args)
    cfg = module.parse(args)
    module.check(cfg)
    module.run(cfg)
    return 0


def main(argv: list[str] | None = None) -> int:
    outlive_closed_pipes()
    argv = list(sys.argv[1:] if argv is None else argv)
    position = next((i for i, a in enumerate(argv) if a in COMMANDS), None)
    if position is None:
        if not argv or argv[0] in ("-h", "--help"):
            print(usage())
            return 0
        return fail(f"unknown command {argv[0]!r}; commands: {', '.join(COMMANDS)} (see --help)")
    command = argv.pop(position)
    debug = any(a.lower() in ("debug=true", "--debug") for a in argv)
    with one_line_errors(debug):  # whatever escapes a command (composing, loading, Ctrl-C): one line
        return run_command(command, argv)
