"""MkDocs hooks (mkdocs.yml ``hooks:``): the generated pages and the nav's automatic entries.

Generated at every build, so they cannot drift from the code:

* ``reference/<command>.md``: one page per ``simkv`` command, from its argparse parser (simkv.cli);
* ``policies/<name>.md``: one page per allocation policy, from its class (summary, options) and its
  module's docstring, which states the rule and its sources;
* ``rules/<name>.md``: one page per runtime rule (RULES below), from the module docstring that states it.

Nav: mkdocs.yml lists the pages in reading order. A page under docs/ that it does not list is added to
the section holding its folder's other pages (docs/guide/new-topic.md: the Guides section), after the
listed ones, in title order; so adding a page needs no edit here, and one line in mkdocs.yml to place it.
"""

from __future__ import annotations

import argparse
import ast
import functools
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the simkv of this tree, not an installed one
    sys.path.insert(0, str(ROOT))

#: Runtime rules with a page of their own: (page, title, module file). Each module's docstring states the
#: rule and where it was read or measured.
RULES = (
    ("mechanics", "OpenVINO plugin mechanics", "policies/mechanics.py"),
    ("genai-scheduler", "GenAI continuous-batching scheduler", "simkv/serving/sched/genai.py"),
    ("paged-pool", "Paged block pool", "simkv/serving/kv/block_pool.py"),
    ("pool-tensors", "Paged pool tensors", "simkv/serving/kv/pool_tensors.py"),
    ("kv-managers", "KV-cache managers per layer kind", "simkv/serving/kv/groups.py"),
    ("contiguous", "Contiguous per-request buffers", "simkv/serving/contiguous.py"),
    ("router", "Replicas and routers", "simkv/serving/router.py"),
    ("cost-model", "The cost model", "simkv/cost/__init__.py"),
    ("layer-kinds", "What each layer keeps", "simkv/kvspec.py"),
    ("hf-config", "Reading a config.json", "simkv/hfconfig/__init__.py"),
    ("precision", "KV precisions and their metadata", "simkv/precision.py"),
)

_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|obj):`~?\.?([^`]+)`")
_LIST_ITEM = re.compile(r"^\s*(?:[*-]|\d+\.) ")


def rst_to_markdown(text: str) -> str:
    """A docstring's reStructuredText-isms as Markdown: ``code`` and :role:`target` as `code`, and a blank
    line before a list (Markdown needs one; docstrings often go straight from a colon to the items)."""
    text = _ROLE.sub(lambda m: f"`{m.group(1)}`", text).replace("``", "`")
    out: list[str] = []
    for line in text.splitlines():
        if _LIST_ITEM.match(line) and out and out[-1].strip() and not _LIST_ITEM.match(out[-1]) \
                and not out[-1].startswith(" "):
            out.append("")
        out.append(line)
    return "\n".join(out)


def _cell(text: str) -> str:
    """Plain text safe in a Markdown table cell."""
    text = " ".join(str(text).split())
    for ch in "\\`*_[]|":
        text = text.replace(ch, "\\" + ch)
    return text.replace("<", "&lt;").replace(">", "&gt;")


def _flags(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    metavar = ""
    if action.nargs != 0:
        metavar = action.metavar or (("{" + ",".join(map(str, action.choices)) + "}") if action.choices
                                     else action.dest.upper())
        metavar = " " + str(metavar)
    return ", ".join(f"`{flag}{metavar}`" for flag in action.option_strings)


def command_page(name: str, parser: argparse.ArgumentParser, summary: str) -> str:
    """One command's reference: description, usage, every option by group, the epilog."""
    usage = parser.format_usage().strip()
    lines = [f"# simkv {name}", "", _cell(parser.description or summary), "", "```text", usage, "```", ""]
    for group in parser._action_groups:  # argparse keeps its groups here and nowhere public
        actions = [a for a in group._group_actions if a.help != argparse.SUPPRESS]
        if not actions:
            continue
        title = "options" if group.title in ("optional arguments", "options") else group.title
        lines += [f"## {title[0].upper() + title[1:]}", ""]
        if group.description:
            lines += [_cell(group.description), ""]
        lines += ["| option | meaning |", "|---|---|"]
        for a in actions:
            lines.append(f"| {_flags(a)} | {_cell(a.help or '')} |")
        lines.append("")
    if parser.epilog:
        lines += ["## Notes", "", _cell(parser.epilog), ""]
    lines += [f"`simkv {name} --help` prints the same in the terminal.", ""]
    return "\n".join(lines)


def policy_page(cls) -> str:
    """One policy: its rule in a line, options, default precision, and its module docstring (rule and sources)."""
    source = cls.__module__.replace(".", "/") + ".py"
    doc = ast.get_docstring(ast.parse((ROOT / source).read_text())) or ""
    lines = [f"# {cls.name}", "", _cell(cls.summary), "",
             f"Default KV precision: `{cls.default_precision}`. Source file: `{source}`. "
             f"Use it with `simkv run --policy {cls.name}`; set an option with `--policy-opt KEY=VALUE`.", ""]
    options = cls.options()
    if options:
        lines += ["## Options", "", "| option | default | meaning |", "|---|---|---|"]
        lines += [f"| `{f.name}` | `{f.default}` | {_cell(f.metadata.get('help', ''))} |" for f in options]
        lines.append("")
    lines += ["## The rule and its sources", "", rst_to_markdown(doc), ""]
    return "\n".join(lines)


def rule_page(title: str, source: str) -> str:
    doc = ast.get_docstring(ast.parse((ROOT / source).read_text())) or ""
    return "\n".join([f"# {title}", "", f"Source file: `{source}`.", "", rst_to_markdown(doc), ""])


@functools.cache
def generated_pages() -> dict[str, str]:
    """Every generated page: its path under docs/ and its Markdown (the index pages first)."""
    from policies import REGISTRY
    from simkv.cli import COMMANDS, build_parser

    os.environ["COLUMNS"] = "100"  # argparse wraps the usage lines to the terminal: the same page everywhere
    top = build_parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help for c in sub._choices_actions}
    names = [command.__name__.rsplit(".", 1)[1] for command in COMMANDS]
    pages = {
        "reference/index.md": "\n".join(
            ["# Commands", "", "Every `simkv` command, each page generated from the command's own parser.", "",
             "| command | what it does |", "|---|---|"]
            + [f"| [`simkv {n}`]({n}.md) | {_cell(helps.get(n, ''))} |" for n in names]) + "\n",
        "policies/index.md": "\n".join(
            ["# Policies", "",
             "An allocation policy sizes each K/V buffer of a stateful session (`simkv run --policy NAME`; "
             "`simkv policies` lists them with their options). One file each in `policies/`, behind the "
             "interface of `policies/base.py`; each page below is generated from its file.", "",
             "| policy | rule |", "|---|---|"]
            + [f"| [`{n}`]({n}.md) | {_cell(c.summary)} |" for n, c in REGISTRY.items()]
            + ["", "A policy sizes a buffer (`capacity(needed, primitive_id)`), may ask for an oversized buffer to be "
               "rebuilt (`reclaim`), and may refuse a workload (`check`). How the old buffer is released, what "
               "`reset` does, whether memory is resident on first touch, beam tables and the device-memory "
               "headroom limit are *mechanics* options every policy carries, so any rule can be tried under "
               "either runtime's mechanics (`--policy-opt free_old=immediate`; "
               "[OpenVINO plugin mechanics](../rules/mechanics.md)). A new policy is a new file in `policies/` "
               "listed in `policies/__init__.py`: it appears here, in `simkv policies` and in the dashboard."]) + "\n",
        "rules/index.md": "\n".join(
            ["# Runtime rules", "",
             "The rules simkv follows where a runtime decides, each stated with its source in the docstring "
             "of the module that implements it; each page below is generated from that docstring.", "",
             "| rule | module |", "|---|---|"]
            + [f"| [{t}]({s}.md) | `{src}` |" for s, t, src in RULES]) + "\n",
    }
    for name in names:
        pages[f"reference/{name}.md"] = command_page(name, sub.choices[name], helps.get(name, ""))
    for name, cls in REGISTRY.items():
        pages[f"policies/{name}.md"] = policy_page(cls)
    for slug, title, source in RULES:
        pages[f"rules/{slug}.md"] = rule_page(title, source)
    return pages


# --- MkDocs events -------------------------------------------------------------------------------------

def _listed(nav) -> set[str]:
    """Every page path the nav names."""
    found: set[str] = set()
    for item in nav or ():
        value = next(iter(item.values())) if isinstance(item, dict) else item
        if isinstance(value, list):
            found |= _listed(value)
        elif isinstance(value, str):
            found.add(value)
    return found


def _sections(nav):
    """Every (list of entries) in the nav, with the folders of the pages it lists directly."""
    for item in nav or ():
        value = next(iter(item.values())) if isinstance(item, dict) else item
        if isinstance(value, list):
            folders = {str(Path(v).parent) for e in value for v in ([next(iter(e.values()))] if isinstance(e, dict)
                                                                      else [e]) if isinstance(v, str)}
            yield value, folders
            yield from _sections(value)


def _title(path: Path) -> str:
    for line in path.read_text().splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return path.stem.replace("-", " ").capitalize()


def on_config(config):
    """Generated pages and any page not listed go into the nav, each in the section of its folder."""
    docs = Path(config["docs_dir"])
    nav = config["nav"]
    listed = _listed(nav)
    pages = {p: None for p in generated_pages()}
    for path in sorted(docs.rglob("*.md")):
        pages.setdefault(path.relative_to(docs).as_posix(), path)
    extra: dict[str, list[tuple[str, str]]] = {}
    for page, path in pages.items():
        if page in listed:
            continue
        title = _title(path) if path else generated_titles()[page]
        extra.setdefault(str(Path(page).parent), []).append((title, page))
    top = {str(Path(e).parent) for e in (next(iter(i.values())) if isinstance(i, dict) else i for i in nav)
           if isinstance(e, str)}
    for entries, folders in [(nav, top), *_sections(nav)]:
        for folder in sorted(folders):
            for title, page in sorted(extra.pop(folder, []), key=lambda e: e[0].lower()):
                entries.append({title: page})
    return config


def generated_titles() -> dict[str, str]:
    """A generated page's nav title: its heading (the command, policy or rule)."""
    return {page: text.splitlines()[0][2:] for page, text in generated_pages().items()}


def on_files(files, config):
    """Add the generated pages to the build (they exist only in memory)."""
    from mkdocs.structure.files import File

    for page, text in generated_pages().items():
        files.append(File.generated(config, page, content=text))
    return files
