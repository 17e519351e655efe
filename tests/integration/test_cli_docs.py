"""The docs match the program: every command the README and the documentation site (docs/)
show parses, every short one runs as written, every command in the command table has a
working --help that knows the options shown, every example config and every TOML block
parses with its loader, and `--help` stays fast (no torch, gRPC, faiss, matplotlib)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from vflink.cli import link as link_cli
from vflink.cli import train as train_cli
from vflink.cli.main import build_parser, main
from vflink.runfiles.algorithms import algorithm_names

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
#: Every page a reader sees: the README and the documentation site's Markdown pages.
PAGES = {"README.md": README, **{
    str(p.relative_to(ROOT)): p.read_text(encoding="utf-8")
    for p in sorted((ROOT / "docs").rglob("*.md"))}}
DOCS = "\n".join(PAGES.values())
#: The page with the annotated run file that TOML fragments elsewhere complete.
RUN_FILE_PAGE = "docs/reference/run-file.md"
HEAVY = ("torch", "grpc", "faiss", "matplotlib", "pandas", "sklearn")


def blocks(language: str, text: str = DOCS) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def shell_lines(text: str = DOCS) -> list[str]:
    """Every shell line a page shows: its ```bash blocks and its indented code blocks (four
    spaces after a blank line), continuation lines joined, split at `&&` and `;`."""
    chunks = blocks("bash", text)
    chunks += ["\n".join(line[4:] for line in m.group(1).splitlines())
               for m in re.finditer(r"(?:^|\n\n)((?: {4}\S.*\n?)(?: {4}.*\n?)*)", text)
               if not m.group(1).lstrip().startswith(("|", "-", "*"))]
    out = []
    for chunk in chunks:
        for line in chunk.replace("\\\n", " ").splitlines():
            out.extend(part.strip().rstrip("&").strip() for part in re.split(r"&&|;", line)
                       if part.strip() and not part.strip().startswith("#"))
    return out


def python_commands() -> list[list[str]]:
    """The `python benchmarks/...` and `python scripts/...` lines of the pages, as argv
    after the interpreter (environment assignments and the interpreter dropped)."""
    out = []
    for line in shell_lines():
        words = shlex.split(line)
        while words and re.match(r"^[A-Z_]+=", words[0]):
            words = words[1:]
        if words and re.search(r"(^|/)python3?$", words[0]) and len(words) > 1 \
                and words[1].startswith(("benchmarks/", "scripts/")):
            out.append(words)
    return out


def readme_commands(text: str | None = None) -> list[list[str]]:
    """Every `vflink ...` command line of the README and the docs pages (or of ``text``): in
    their ```bash blocks and indented code blocks, as argv after `vflink`."""
    commands = []
    for line in shell_lines(DOCS if text is None else text):
        words = shlex.split(line)
        for i, w in enumerate(words):
            if w.endswith("vflink") and i + 1 < len(words):
                commands.append(words[i + 1:])
                break
    return commands


def table_commands() -> list[list[str]]:
    return [shlex.split(cmd) for cmd in re.findall(r"^\| `vflink ([^`]*)` \|", DOCS,
                                                      flags=re.M)]


def test_readme_shows_commands() -> None:
    assert len(table_commands()) >= 7
    assert {c[0] for c in readme_commands()} >= {"demo", "link", "certs", "serve", "train"}
    assert {c[0] for c in table_commands()} >= {
        "demo", "train", "link", "experiment", "predict", "serve", "certs", "report"}


def test_readme_keeps_the_quickstart_and_points_into_the_docs() -> None:
    """The README is what a visitor reads first: its Quickstart's two commands stay exactly
    these, and it links into the documentation site."""
    quickstart = README.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    assert blocks("bash", quickstart)[:2] == [
        "python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e . && "
        ".venv/bin/python -m compileall -q src && .venv/bin/vflink demo\n",
        "python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e '.[dev]' && "
        ".venv/bin/python -m compileall -q src && .venv/bin/python -m pytest\n"]
    for page in re.findall(r"\]\((docs/[^)#]+)", README):
        assert (ROOT / page).is_file(), page


@pytest.mark.parametrize("argv", readme_commands(),
                         ids=lambda a: " ".join(a)[:60])
def test_every_readme_command_parses(argv: list[str]) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)  # argparse exits (SystemExit 2) on an unknown option
    assert callable(args.func)


#: README commands that need a served peer, so they run in the network tests, not here:
#: (a word of the command, why)
NEEDS_PEERS = (("serve", "runs until stopped (tests/integration/test_serve.py)"),
               ("--party", "talks to parties served by `vflink serve` (tests/integration/"
                           "test_serve.py, test_set_alignment.py, test_resume.py)"))


def needs_peers(argv: list[str]) -> str | None:
    return next((why for word, why in NEEDS_PEERS if word in argv), None)


#: options that name an input a command reads
INPUTS = ("--primary", "--secondary", "--input", "--config", "--run", "--party")


def test_no_command_names_a_development_machines_path() -> None:
    """A reader's machine has the repository and its `.venv`, nothing at absolute paths of
    the machine the docs were written on (a benchmark was shown run by /work/venv-ray's
    Python)."""
    for line in shell_lines():
        for word in shlex.split(line):
            value = word.split("=", 1)[-1]
            assert not value.startswith(("/", "~")) or value in ("/dev/null",), line
    for argv in python_commands():
        assert argv[0] in ("python", "python3", ".venv/bin/python"), argv


@pytest.mark.parametrize("argv", python_commands(), ids=lambda a: " ".join(a[1:])[:60])
def test_every_documented_script_takes_its_options(argv: list[str]) -> None:
    """`python benchmarks/x.py --opt ...` as a page shows it: the script exists and accepts
    every option given (parsed, then stopped before the minutes of work)."""
    script = ROOT / argv[1]
    assert script.is_file(), argv
    probe = ("import argparse, runpy, sys\n"
             "parse = argparse.ArgumentParser.parse_args\n"
             "def parse_only(self, args=None, namespace=None):\n"
             "    parse(self, args, namespace)\n"
             "    raise SystemExit(0)\n"
             "argparse.ArgumentParser.parse_args = parse_only\n"
             "sys.argv = sys.argv[1:]\n"
             "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", probe, str(script), *argv[2:]], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False,
                          env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, (argv, done.stderr[-2000:])


def outputs(argv: list[str]) -> list[str]:
    """What a command writes that a later one may read: its --out (vflink demo: runs/demo)."""
    if "--out" in argv:
        return [argv[argv.index("--out") + 1].rstrip("/")]
    return ["runs/demo"] if argv[0] == "demo" else []


def test_every_input_a_command_names_is_there_where_the_reader_stands() -> None:
    """Run from the repository root, as the pages say: every file a command reads ships with
    the repository or is written by a command shown before it (`vflink demo` → runs/demo;
    `vflink certs --out certs`). A page's `houses.csv` that exists nowhere fails here."""
    made: set[str] = set()
    for argv in readme_commands():
        named = [argv[i + 1] for i, w in enumerate(argv[:-1]) if w in INPUTS]
        for value in named:
            assert (ROOT / value).exists() or any(
                value == m or value.startswith(m + "/") for m in made), (argv, value)
        made.update(outputs(argv))


@pytest.mark.slow
def test_every_short_documented_command_runs_as_written(tmp_path: Path) -> None:
    """A new user copies the commands of the README and of every documentation page into a
    fresh clone. Each one that needs no served peer runs here, in the pages' order (`vflink
    demo` before the `vflink predict` that uses its run), from a directory laid out like the
    repository root, and exits 0."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
           "OMP_NUM_THREADS": "1"}
    # each distinct command once: the Quickstart's demo is on two pages, and a second run
    # would rightly refuse to overwrite the first one's output (docs/reference/file-formats.md)
    commands = [argv for argv in map(list, dict.fromkeys(map(tuple, readme_commands())))
                if not needs_peers(argv) and argv[0] not in ("train", "experiment")]
    # (long runs: test_cli.py, test_experiment.py and the reproductions)
    # One fresh interpreter runs them all, in order, through the command line's entry point:
    # the libraries are imported once instead of once per command (a fifth of this test).
    runner = ("import json, sys\n"
              "from vflink.cli.main import main\n"
              "for argv in json.loads(sys.argv[1]):\n"
              "    try:\n"
              "        code = main(argv)\n"
              "    except SystemExit as exc:\n"
              "        code = exc.code\n"
              "    print('vflink-command-exit', json.dumps([argv, code]), flush=True)\n"
              "    if code:\n"
              "        break\n")
    proc = subprocess.run([sys.executable, "-c", runner, json.dumps(commands)], cwd=tmp_path,
                          capture_output=True, text=True, env=env, timeout=600, check=False)
    done = [json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines()
            if line.startswith("vflink-command-exit ")]
    failed = [(argv, code) for argv, code in done if code]
    assert not failed and len(done) == len(commands), (failed, proc.stderr[-3000:])
    assert {"demo", "link", "predict", "align", "certs"} <= {argv[0] for argv, _ in done}
    assert (tmp_path / "predictions.csv").read_text().count("\n") == 21  # header + 20


def test_commands_left_to_the_network_tests_are_only_those_needing_peers() -> None:
    skipped = [a for a in readme_commands() if needs_peers(a)]
    assert skipped and all(a[0] in ("serve", "train", "align") for a in skipped), skipped


@pytest.mark.parametrize("argv", table_commands(), ids=lambda a: a[0])
def test_every_table_command_has_help_naming_its_options(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([argv[0], "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    for option in (a for a in argv if a.startswith("--")):
        assert option in text, option
    # every metavar named in the description is a real argument's
    for name in re.findall(r"\b(DIR|FILE|PRIMARY|SECONDARY)\b", text.split("\n\n", 1)[-1]):
        assert re.search(rf"--\w[\w-]* {name}\b", text) or name in ("PRIMARY", "SECONDARY"), name


def test_train_help_and_example_list_every_algorithm(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    example = (ROOT / "examples" / "splitnn.toml").read_text()
    for name in algorithm_names():
        assert re.search(rf"\b{re.escape(name)}\b", text), name
        assert re.search(rf"\b{re.escape(name)}\b", example), name
        assert f"`{name}`" in DOCS, name


def test_link_help_marks_required_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["link", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--out F" in text.split("Link every")[0]  # in the usage line
    assert text.count("[required: here or in --config]") == 6


def test_cli_constants_agree_with_the_runner() -> None:
    from vflink.runfiles.config import LINK_METRICS as CONFIG_METRICS
    from vflink.runner.encoding import LINK_METRICS

    assert set(link_cli.LINK_METRICS) == set(LINK_METRICS) == set(CONFIG_METRICS)
    from vflink.runner.encoding import PRIVACY

    assert link_cli.PRIVACY == PRIVACY
    assert tuple(train_cli.ALGORITHMS) == algorithm_names()
    from vflink.cli.attack import ATTACK_LINES
    from vflink.runner.attack import attack_lines

    assert list(ATTACK_LINES) == attack_lines()  # `vflink attack --list` spells them out


def test_attack_list_imports_no_attack_library() -> None:
    """`vflink attack --list` answers from its own table: importing every attack's libraries
    (torch, scikit-learn, scipy) took 25 s on a busy 2-core machine."""
    assert run_main_reporting_modules(["attack", "--list"], HEAVY + ("scipy", "sklearn")) \
        == (0, [])


def test_every_experiment_config_is_in_the_readme() -> None:
    for path in sorted((ROOT / "examples" / "experiments").glob("*.toml")):
        assert f"`{path.name}`" in DOCS, path.name


def load_example(path: Path) -> Any:
    """Parse an example file with the loader its kind needs."""
    raw = tomllib.loads(path.read_text(encoding="utf-8"))
    if "experiment" in raw:
        from vflink.runfiles.experiment import load_experiment

        return load_experiment(path)
    if "party" in raw:
        from vflink.runfiles.party import load_party_config

        return load_party_config(path)
    if "link" in raw:
        import argparse

        args = argparse.Namespace(config=path, **{k: None for k in link_cli._KEYS})
        return link_cli.resolve(args)
    from vflink.runfiles.config import load_config

    return load_config(path)


@pytest.mark.parametrize("path", sorted((ROOT / "examples").rglob("*.toml")),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_example_config_parses(path: Path) -> None:
    assert load_example(path) is not None


def test_readme_toml_blocks_parse(tmp_path: Path) -> None:
    from vflink.runfiles.config import parse_config

    found = blocks("toml")
    assert found
    base = tomllib.loads(blocks("toml", PAGES[RUN_FILE_PAGE])[0])
    assert "version" in base
    for i, block in enumerate(found):
        raw = tomllib.loads(block)
        if set(raw) == {"link"}:  # a `vflink link --config` file
            path = tmp_path / f"link-{i}.toml"
            path.write_text(block)
            link_cli.resolve(build_parser().parse_args(["link", "--config", str(path)]))
            continue
        if "version" not in raw:  # a fragment: on top of the README's run file
            raw = {**base, **raw}
        parse_config(raw, base_dir=tmp_path)


def test_example_paths_resolve_against_the_file() -> None:
    exp = load_example(ROOT / "examples" / "experiments" / "imdb-titles.toml")
    assert Path(exp.configs[0].data.options["path"]) == ROOT / "imdb_movies.csv.gz"


def run_main_reporting_modules(argv: list[str], modules: Sequence[str]) -> tuple[int, list[str]]:
    """Run ``vflink argv`` in a fresh interpreter: its exit code and which of ``modules`` it
    imported."""
    code = ("import sys, json\nfrom vflink.cli.main import main\ntry:\n"
            f"    code = main({argv!r})\nexcept SystemExit as e:\n    code = e.code\n"
            f"print(json.dumps([code, sorted(m for m in {tuple(modules)!r} "
            "if m in sys.modules)]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
                         timeout=120, check=True).stdout
    exit_code, loaded = json.loads(out.strip().splitlines()[-1])
    return int(exit_code), list(loaded)


@pytest.mark.parametrize("argv", [["--help"], *([c, "--help"] for c in
                                              ("train", "link", "experiment", "predict",
                                               "demo", "serve", "certs"))],
                         ids=lambda a: " ".join(a))
def test_help_imports_no_heavy_library(argv: list[str]) -> None:
    assert run_main_reporting_modules(argv, HEAVY) == (0, [])


def test_link_imports_no_training_library(tmp_path: Path) -> None:
    """`vflink link` never builds a model: torch, scikit-learn and gRPC stay unloaded (they
    were 2.5 s of a house-scale link's 13 s)."""
    p, s = tmp_path / "p.csv", tmp_path / "s.csv"
    p.write_text("x,y\n0,0\n1,1\n2,2\n", encoding="utf-8")
    s.write_text("x,y\n0,0.1\n1,1.1\n5,5\n", encoding="utf-8")
    argv = ["link", "--primary", str(p), "--secondary", str(s), "--on", "x,y", "--metric",
            "euclidean", "--top-k", "2", "--seed", "0", "--out", str(tmp_path / "links.csv")]
    assert run_main_reporting_modules(argv, ("torch", "sklearn", "grpc")) == (0, [])
    assert (tmp_path / "links.csv").read_text(encoding="utf-8").count("\n") == 7  # header + 6
