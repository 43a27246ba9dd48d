"""`gavel completion bash|zsh`: shell completion scripts made from the command line's own
argparse parser, so a verb or flag added to the parser completes without anyone editing a
script.

Rules:
1. The script is data from the parser: for each command path (``""``, ``"up"``,
   ``"auth init"``) its subcommands, its flags, which flags take a value, and the choices of
   a flag or positional that has them. Nothing else is known to the shell.
2. The shell walks the words typed so far: a word that names a subcommand of the current
   path extends it, a flag that takes a value skips the next word. Then it offers the
   current flag's choices (or file names for a value without choices), the path's flags for
   a word starting with ``-``, else its subcommands and positional choices (or file names).
3. bash and zsh share the tables and the walk; only the last step (what the shell is told)
   differs. No dependency: argcomplete would run Python on every Tab.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

__all__ = ["SHELLS", "script"]

SHELLS = ("bash", "zsh")


@dataclass
class _Path:
    subs: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    valued: list[str] = field(default_factory=list)
    choices: dict[str, list[str]] = field(default_factory=dict)
    positional: list[str] = field(default_factory=list)


def _walk(parser: argparse.ArgumentParser, path: str, out: dict[str, _Path]) -> None:
    here = out.setdefault(path, _Path())
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                here.subs.append(name)
                _walk(sub, f"{path} {name}".strip(), out)
            continue
        if action.option_strings:
            here.flags += action.option_strings
            if action.nargs != 0:
                here.valued += action.option_strings
                if action.choices:
                    for flag in action.option_strings:
                        here.choices[flag] = [str(c) for c in action.choices]
        elif action.choices:
            here.positional += [str(c) for c in action.choices]


def _case(fn: str, rows: dict[str, list[str]]) -> list[str]:
    """A shell function printing the words of the first matching key."""
    lines = [f"{fn}() {{", '    case "$1" in']
    for key, words in rows.items():
        if words:
            lines.append(f"        {_quote(key)}) echo {_quote(' '.join(words))} ;;")
    lines += ["    esac", "}"]
    return lines


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _tables(parser: argparse.ArgumentParser) -> list[str]:
    paths: dict[str, _Path] = {}
    _walk(parser, "", paths)
    lines = _case("_gavel_subs", {k: p.subs for k, p in paths.items()})
    lines += _case("_gavel_flags", {k: p.flags for k, p in paths.items()})
    lines += _case("_gavel_positional", {k: p.positional for k, p in paths.items()})
    lines += _case("_gavel_choices", {f"{k}|{flag}": c for k, p in paths.items()
                                      for flag, c in p.choices.items()})
    valued = [f"{k}|{flag}" for k, p in paths.items() for flag in p.valued]
    lines += ["_gavel_valued() {", '    case "$1" in',
              f"        {'|'.join(_quote(v) for v in valued) or '__none__'}) return 0 ;;",
              "    esac", "    return 1", "}"]
    return lines


# The walk of rule 2; $1.. are the words before the current one (the command name first).
_WALK = r"""
_gavel_walk() {
    _gavel_path="" _gavel_skip=0 _gavel_prev=""
    local w s
    shift
    for w in "$@"; do
        if [ "$_gavel_skip" = 1 ]; then _gavel_skip=0; _gavel_prev=""; continue; fi
        case "$w" in
            -*) _gavel_valued "$_gavel_path|$w" && { _gavel_skip=1; _gavel_prev="$w"; }
                continue ;;
        esac
        for s in $(_gavel_subs "$_gavel_path"); do
            if [ "$s" = "$w" ]; then _gavel_path="${_gavel_path:+$_gavel_path }$w"; break; fi
        done
    done
}
"""

_BASH = r"""
_gavel() {
    local cur="${COMP_WORDS[COMP_CWORD]}" words
    _gavel_walk "${COMP_WORDS[@]:0:COMP_CWORD}"
    if [ "$_gavel_skip" = 1 ]; then
        words=$(_gavel_choices "$_gavel_path|$_gavel_prev")
        if [ -n "$words" ]; then
            COMPREPLY=($(compgen -W "$words" -- "$cur"))
        else
            COMPREPLY=($(compgen -f -- "$cur"))
        fi
        return 0
    fi
    case "$cur" in
        -*) COMPREPLY=($(compgen -W "$(_gavel_flags "$_gavel_path")" -- "$cur")); return 0 ;;
    esac
    words="$(_gavel_subs "$_gavel_path") $(_gavel_positional "$_gavel_path")"
    if [ -n "${words// /}" ]; then
        COMPREPLY=($(compgen -W "$words" -- "$cur"))
    else
        COMPREPLY=($(compgen -f -- "$cur"))
    fi
}
complete -F _gavel gavel
"""

_ZSH = r"""
_gavel() {
    local cur="${words[CURRENT]}" list
    _gavel_walk "${(@)words[1,CURRENT-1]}"
    if [ "$_gavel_skip" = 1 ]; then
        list=$(_gavel_choices "$_gavel_path|$_gavel_prev")
        if [ -n "$list" ]; then compadd -- ${=list}; else _files; fi
        return
    fi
    case "$cur" in
        -*) list=$(_gavel_flags "$_gavel_path"); compadd -- ${=list}; return ;;
    esac
    list="$(_gavel_subs "$_gavel_path") $(_gavel_positional "$_gavel_path")"
    if [ -n "${list// /}" ]; then compadd -- ${=list}; else _files; fi
}
(( $+functions[compdef] )) || { autoload -Uz compinit && compinit; }
compdef _gavel gavel
"""


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script for `shell` ("bash" or "zsh")."""
    if shell not in SHELLS:
        raise ValueError(f"no completion for {shell!r}: expected one of {', '.join(SHELLS)}")
    head = [f"# gavel completion for {shell}, made by `gavel completion {shell}` from the "
            "gavel command line itself.",
            f'# Load it with: eval "$(gavel completion {shell})"']
    if shell == "zsh":
        head.insert(0, "#compdef gavel")
    body = _BASH if shell == "bash" else _ZSH
    return "\n".join(head + _tables(parser)) + _WALK + body
