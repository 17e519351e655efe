"""MkDocs hook: the reference pages are generated from the code at every build.

A page asks for a generated block with a marker on a line of its own, e.g.
``<!-- vflink:cli -->``; :func:`on_page_markdown` replaces it with the block. So the command
line reference comes from the argparse parsers, the run-file and party-file keys from the
config dataclasses (defaults, and the validation their ``__post_init__`` performs), the exit
codes from ``vflink.cli._errors`` and the protocol state tables from
``vflink.protocol.sessions.describe()``: none of them can go stale, and ``mkdocs build
--strict`` fails if a marker names no generator.

Run it by hand to print one block: ``python docs/gen_ref.py cli``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import os
import re
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:  # the checkout's vflink, installed or not
    sys.path.insert(0, str(ROOT / "src"))

MARKER = re.compile(r"^<!-- vflink:([a-z0-9-]+) -->$", flags=re.M)


# ------------------------------------------------------------------------------ the CLI


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _option_row(action: argparse.Action) -> str:
    if action.option_strings:
        name = ", ".join(f"`{o}`" for o in action.option_strings)
    else:
        name = f"`{action.metavar or action.dest}`"
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        value = " \\| ".join(f"`{c}`" for c in action.choices)
    elif action.nargs == 0:
        value = "(flag)"
    else:
        value = f"`{action.metavar or action.dest.upper()}`"
    default = action.default
    shown = "" if default in (None, False, argparse.SUPPRESS) or action.nargs == 0 else (
        f"`{default}`")
    return f"| {name} | {value} | {shown} | {_escape(action.help or '')} |"


def cli() -> str:
    """Every command: its description and a table of its options, from the parsers."""
    os.environ.setdefault("COLUMNS", "100")
    from vflink.cli.main import build_parser

    parser = build_parser()
    commands = _subparsers(parser)
    helps = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
    out = ["| command | what it does |", "|---|---|"]
    out += [f"| [`vflink {name}`](#vflink-{name}) | {_escape(helps.get(name) or '')} |"
            for name in commands]
    for name, sub in commands.items():
        out += ["", f"## `vflink {name}` {{#vflink-{name}}}", "", "```text",
                sub.format_usage().strip(), "```", ""]
        if sub.description:
            out += ["```text", textwrap.dedent(sub.description).strip(), "```", ""]
        out += ["| option | value | default | meaning |", "|---|---|---|---|"]
        out += [_option_row(a) for a in sub._actions if not isinstance(a, argparse._HelpAction)]
    return "\n".join(out)


def exit_codes() -> str:
    from vflink.cli._errors import EXIT_CODES_HELP

    return "```text\n" + EXIT_CODES_HELP.strip() + "\n```"


# ------------------------------------------------------------------ config dataclasses


def _literal(node: ast.AST, env: dict[str, Any]) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        if isinstance(node, ast.Name) and node.id in env:
            return env[node.id]
        if isinstance(node, ast.Attribute):
            return None
        raise


def _describe_check(func: str, args: list[Any], kwargs: dict[str, Any]) -> str:
    if func == "check_choice":
        return "one of " + ", ".join(f"`{c}`" for c in args[0])
    if func == "check_str_tuple":
        return "a list of non-empty column names"
    kind = "an integer" if func == "check_int" else "a finite number"
    bounds = []
    if kwargs.get("min") is not None:
        bounds.append(f"{'>' if kwargs.get('min_exclusive') else '≥'} {kwargs['min']:g}")
    if kwargs.get("max") is not None:
        bounds.append(f"≤ {kwargs['max']:g}")
    text = kind + (" " + " and ".join(bounds) if bounds else "")
    if kwargs.get("allow_none"):
        text += ", or unset"
    return text


def _checks(cls: type) -> dict[str, str]:
    """Field name → the validation ``__post_init__`` applies (the ``check_*`` helpers)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    module = sys.modules[cls.__module__]
    env = vars(module)
    found: dict[str, str] = {}
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("check_int", "check_float", "check_choice",
                                     "check_str_tuple")):
            continue
        if len(node.args) < 3:
            continue
        target = node.args[2]
        if not (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                and target.value.id == "self"):
            continue
        try:
            rest = [_literal(a, env) for a in node.args[3:]]
            kwargs = {k.arg: _literal(k.value, env) for k in node.keywords if k.arg}
        except (ValueError, TypeError, SyntaxError):
            continue
        if node.func.id == "check_choice" and (not rest or rest[0] is None):
            continue
        found.setdefault(target.attr, _describe_check(node.func.id, rest, kwargs))
    return found


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        if dataclasses.is_dataclass(value):
            return "(the table's defaults)"
    else:
        return "**required**"
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, (tuple, list)):
        return f"`{list(value)!r}`" if value else "`[]`"
    if isinstance(value, Path):
        return f"`{str(value)!r}`"
    if hasattr(value, "value"):
        return f"`{value.value!r}`"
    return f"`{value!r}`"


def _type(f: dataclasses.Field[Any]) -> str:
    text = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    return "`" + text.replace("|", "\\|") + "`"


def config_table(cls: type, *, skip: tuple[str, ...] = (), title: str | None = None) -> str:
    """One table of ``cls``'s keys: type, default and validation, with its docstring."""
    checks = _checks(cls)
    doc = inspect.cleandoc(cls.__doc__ or "")
    out = []
    if title:
        out += [f"### {title}", ""]
    if doc and not doc.startswith(cls.__name__ + "("):
        out += [doc, ""]
    out += ["| key | type | default | checked |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        out.append(f"| `{f.name}` | {_type(f)} | {_default(f)} | "
                   f"{_escape(checks.get(f.name, ''))} |")
    return "\n".join(out)


def run_file() -> str:
    """Every run-file key, table by table, from the dataclasses ``parse_config`` builds."""
    from vflink.data.schema import PartySchema
    from vflink.models.merge import AggregatorConfig
    from vflink.parties.policy import PartyPolicy
    from vflink.privacy.config import PrivacyConfig
    from vflink.runfiles.config import (
        AlignmentConfig,
        DataConfig,
        EvaluationConfig,
        ModelConfig,
        RunConfig,
        TrainingConfig,
    )

    sections = [
        ("top level", RunConfig, ("data", "alignment", "model", "training", "policy",
                                  "evaluation", "privacy")),
        ("[data]", DataConfig, ("parties",)),
        ("[[data.parties]]", PartySchema, ("path",)),
        ("[alignment]", AlignmentConfig, ()),
        ("[model]", ModelConfig, ("aggregator",)),
        ("[model.aggregator]", AggregatorConfig, ()),
        ("[training]", TrainingConfig, ()),
        ("[evaluation]", EvaluationConfig, ()),
        ("[privacy]", PrivacyConfig, ()),
        ("[policy]", PartyPolicy, ()),
    ]
    parts = [config_table(cls, skip=skip, title=f"`{title}`" if title.startswith("[") else
                          title.capitalize()) for title, cls, skip in sections]
    parts[2] += ("\n| `path` | `Path` | **required** in a run file | the table's file, "
                 "relative to the run file |")
    return "\n\n".join(parts)


def party_file() -> str:
    """The party file's keys, from :class:`PartyConfig` and the tables it holds."""
    from vflink.parties.policy import PartyPolicy
    from vflink.parties.resources import TrainingResources
    from vflink.runfiles import party as party_config

    example = inspect.getdoc(party_config) or ""
    annotated = example.split("::", 1)[1] if "::" in example else ""
    return "\n\n".join([
        "An annotated party file (from `vflink/runfiles/party.py`):",
        "```toml\n" + textwrap.dedent(annotated).strip() + "\n```",
        config_table(party_config.PartyConfig, title="Fields of the loaded party file "
                     "(`PartyConfig`)"),
        config_table(PartyPolicy, title="`[policy]`"),
        config_table(TrainingResources, title="`[training]`"),
    ])


def sessions() -> str:
    from vflink.protocol.sessions import describe

    # one level below the page's sections
    return re.sub(r"^#### ", "### ", describe(), flags=re.M)


def _measured(name: str) -> Callable[[], str]:
    """The measured results committed beside the experiment configs, one heading level down,
    so that a reproduction page shows what the experiments last produced."""

    def render_file() -> str:
        text = (ROOT / "examples" / "experiments" / name).read_text(encoding="utf-8")
        return re.sub(r"^(#+) ", lambda m: "#" + m.group(1) + " ", text, flags=re.M)

    return render_file


GENERATORS: dict[str, Callable[[], str]] = {
    "cli": cli, "exit-codes": exit_codes, "run-file": run_file, "party-file": party_file,
    "sessions": sessions, "florist-results": _measured("florist-results.md"),
    "imdb-gap": _measured("imdb-gap.md"),
}

#: Figures of the experiments, published with the reproduction pages (``figures/<name>``).
FIGURES = ("florist-figure2.png",)


def render(markdown: str, where: str = "page") -> str:
    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise KeyError(f"{where}: no generator {name!r} (known: {sorted(GENERATORS)})")
        return GENERATORS[name]()

    return MARKER.sub(one, markdown)


def on_files(files: Any, config: Any) -> Any:
    """MkDocs hook: the experiments' figures, from ``examples/experiments/``, become
    ``reproductions/figures/<name>`` of the site (one copy in the repository)."""
    from mkdocs.structure.files import File

    for name in FIGURES:
        files.append(File.generated(
            config, f"reproductions/figures/{name}",
            abs_src_path=str(ROOT / "examples" / "experiments" / name)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """MkDocs hook (``hooks:`` in mkdocs.yml)."""
    return render(markdown, page.file.src_path)


if __name__ == "__main__":
    for name in sys.argv[1:] or sorted(GENERATORS):
        sys.stdout.write(GENERATORS[name]() + "\n")
