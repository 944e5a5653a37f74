"""`ckpt-ha completion bash|zsh`: a static shell completion script, generated from the parser.

Why generated here rather than argcomplete or shtab: the script is plain shell written from the
same `argparse` tree the command parses with, so it cannot drift from the commands and needs no
new dependency on the light base install (where `verify` runs); and, unlike argcomplete, a TAB
does not start Python and import the CLI. zsh runs the same functions through its
`bashcompinit` layer.

What it completes: commands and sub-commands, each command's own options, the values of
options and positionals with fixed choices (`--state`, `--scenario`, `serve NAME`, ...); any
other value falls back to file names (`complete -o default`).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from pathlib import Path

from ckpt_ha.cli.arguments import Parser

_WORD = re.compile(r"^[A-Za-z0-9_.:/=+-]+$")
"""What may appear unquoted in the script: every command, option and choice is such a word."""


@dataclass
class Node:
    """One command (the path of words from `ckpt-ha` to it) and what may follow it."""

    path: tuple[str, ...]
    commands: list[str] = field(default_factory=list)
    options: list[str] = field(default_factory=list)
    valued: dict[str, list[str]] = field(default_factory=dict)
    """Options that take a value, with its choices (empty: any value, file names offered)."""
    positional: list[str] = field(default_factory=list)
    """Choices of the positional arguments."""
    hidden: list[str] = field(default_factory=list)
    """Old spellings of commands: followed when typed, never offered."""


def nodes(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[Node]:
    """Every command of the tree, parents first."""
    node = Node(path)
    children: list[Node] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            hidden = parser.hidden if isinstance(parser, Parser) else []
            for name, sub in action.choices.items():
                (node.hidden if name in hidden else node.commands).append(name)
                children += nodes(sub, (*path, name))
        elif action.option_strings:
            node.options += action.option_strings
            if action.nargs != 0:
                for option in action.option_strings:
                    node.valued[option] = [str(c) for c in action.choices or ()]
        elif action.choices:
            node.positional += [str(c) for c in action.choices]
    return [node, *children]


def _words(values: list[str]) -> str:
    for value in values:
        if not _WORD.fullmatch(value):
            raise ValueError(f"{value!r} cannot be completed safely")  # a parser change to review
    return " ".join(values)


def bash(prog: str = "ckpt-ha") -> str:
    """The bash script: `eval "$(ckpt-ha completion bash)"`."""
    from ckpt_ha.cli.parser import build_parser  # which builds this module's command too

    tree = nodes(build_parser())
    fn = "_" + re.sub(r"\W", "_", prog)
    node_cases, choice_cases = [], []
    for n in tree:
        key = " ".join(n.path)
        node_cases.append(
            f'        "{key}") subs="{_words(n.commands)}"; hid="{_words(n.hidden)}";'
            f' opts="{_words(n.options)}"; vals="{_words(list(n.valued))}";'
            f' pos="{_words(n.positional)}" ;;'
        )
        for option, choices in n.valued.items():
            if choices:
                choice_cases.append(f'        "{key}|{option}") echo "{_words(choices)}" ;;')
    return _BASH.format(
        prog=prog,
        fn=fn,
        node_cases="\n".join(node_cases),
        choice_cases="\n".join(choice_cases),
    )


def zsh(prog: str = "ckpt-ha") -> str:
    """The zsh script: the bash functions through zsh's `bashcompinit`
    (`eval "$(ckpt-ha completion zsh)"` after `compinit`)."""
    return (
        f"#compdef {prog}\n"
        "# zsh completion for ckpt-ha: the bash completion through zsh's bashcompinit.\n"
        "autoload -U +X bashcompinit && bashcompinit\n" + bash(prog)
    )


def register(top: Parser) -> None:
    co = top.command(
        "completion",
        help="print a shell completion script",
        description="Prints a static completion script generated from this command line. "
        'bash: eval "$(ckpt-ha completion bash)" in ~/.bashrc; zsh: eval '
        '"$(ckpt-ha completion zsh)" in ~/.zshrc (after compinit).',
        handler=cmd_completion,
    )
    co.add_argument("shell", choices=["bash", "zsh"])


def cmd_completion(args: argparse.Namespace, env: dict[str, str], home: Path) -> int:
    print(bash() if args.shell == "bash" else zsh(), end="")
    return 0


_BASH = """\
# bash completion for {prog}, generated from its argument parser: `{prog} completion bash`.
{fn}_node() {{
    case "$1" in
{node_cases}
        *) subs=""; hid=""; opts=""; vals=""; pos="" ;;
    esac
}}
{fn}_choices() {{
    case "$1|$2" in
{choice_cases}
    esac
}}
{fn}() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="" path="" word skip="" i
    local subs hid opts vals pos
    (( COMP_CWORD > 0 )) && prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    {fn}_node ""
    for (( i = 1; i < COMP_CWORD; i++ )); do
        word="${{COMP_WORDS[i]}}"
        if [[ -n $skip ]]; then skip=""; continue; fi
        [[ $word == -- ]] && return 0  # a command of its own follows (`run -- ...`)
        if [[ " $vals " == *" $word "* ]]; then skip=1; continue; fi
        if [[ " $subs $hid " == *" $word "* ]]; then
            path="${{path:+$path }}$word"
            {fn}_node "$path"
        fi
    done
    COMPREPLY=()
    if [[ -n $skip ]]; then  # the word is the value of the option before it
        local choices
        choices="$({fn}_choices "$path" "$prev")"
        [[ -n $choices ]] && COMPREPLY=( $(compgen -W "$choices" -- "$cur") )
        return 0
    fi
    if [[ $cur == -* ]]; then
        COMPREPLY=( $(compgen -W "$opts" -- "$cur") )
    else
        COMPREPLY=( $(compgen -W "$subs $pos" -- "$cur") )
    fi
    return 0
}}
complete -o default -F {fn} {prog}
"""
