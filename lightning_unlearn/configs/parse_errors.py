"""One line for a jsonargparse error, shared by ``fit`` / ``validate`` and the workflow commands: the key that is
wrong, the value given and the fix (the closest valid option, the type expected, the choices), not a usage dump."""

from __future__ import annotations

import contextlib
import difflib
import importlib
import re
import sys

from lightning_unlearn.configs import init_parameters


def parse_error_line(message: str, parser) -> str:
    """The one line of a jsonargparse error: the unknown key and its closest valid spelling, else the first line."""

    options = re.findall(r"Option '([^']+)' is not accepted", message)
    classes = re.findall(r"given class_path '([^']+)'", message)
    keys = re.findall(r'Parser key "([^"]+)"', message)
    if options and classes and keys:
        option, cls_path = options[-1], classes[-1]  # the innermost: where the unknown key was looked up
        flag = f"--{keys[0]}.init_args." + ".".join([*keys[1:], option])
        close = difflib.get_close_matches(option, init_parameters(cls_path), n=1)
        hint = f"; did you mean {flag.rsplit('.', 1)[0]}.{close[0]}?" if close else ""
        return f"{flag} is not an option of {cls_path}{hint}"
    choice = re.search(r"Parser key \"([^\"]+)\":\s*\n\s*Expected a typing\.Literal\[(.*)\]\. Got value: (.*)", message)
    if choice:  # a value outside a fixed set of choices
        key, choices, value = choice.groups()
        return f"--{key} {value.strip()!r} is not one of {choices}"
    expected = re.findall(r"Expected a <class '([^']+)'>\. Got value: (.*)", message)
    if expected and keys:  # a value of the wrong type: the innermost complaint, the whole key
        typename, value = expected[0][0].rsplit(".", 1)[-1], expected[0][1].strip()
        flag = f"--{keys[0]}" + (".init_args." + ".".join(keys[1:]) if len(keys) > 1 else "")
        article = "an" if typename[0] in "aeiou" else "a"
        if typename == "float" and value.lower().lstrip("+-") in ("nan", "inf", "infinity"):
            return f"{flag}: {value!r} is not a finite number; give a finite float there"
        return f"{flag}: {value!r} is not {article} {typename}; give {article} {typename} there"
    union = re.search(r"Subtypes: \[(.*)\][\s\S]*Given value: (.*)", message)
    if union and len(keys) == 1 and "given class_path" not in message:  # a plain value that fits none of its types
        names = ", ".join(re.findall(r"<class '(?:[\w.]*\.)?(\w+)'>", union.group(1)))
        return f"--{keys[0]}: {union.group(2).strip()!r} is none of {names}; give one of those"
    missing = re.search(
        r"given class_path '([^']+)':\s*\n\s*(module '[^']+' has no attribute '[^']+'|No module named[^\n]*)", message
    )
    if missing and keys:  # an objective, callback or logger class that cannot be imported
        cls_path, reason = missing.groups()
        module_name, _, name = cls_path.rpartition(".")
        hint = ""
        with contextlib.suppress(ImportError, ValueError):
            close = difflib.get_close_matches(name, dir(importlib.import_module(module_name)), n=1)
            hint = f"; did you mean {module_name}.{close[0]}?" if close else ""
        return f"--{keys[0]}.class_path {cls_path!r} cannot be imported ({reason}){hint}"
    unknown = re.search(r"unrecognized arguments: (\S+)", message, re.IGNORECASE)
    if unknown:
        key = unknown.group(1).split("=")[0]
        options = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
        close = difflib.get_close_matches(key, options, n=1, cutoff=0.75)
        return f"{key} is not an option" + (f"; did you mean {close[0]}?" if close else "")
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    return " ".join(lines[:2])[:400] if lines else message


def exit_in_one_line(parser, message: str, ex: Exception | None = None):
    """What a ``lightning-unlearn`` parser's ``error`` does: one line on stderr (:func:`parse_error_line`, the command
    named as the user typed it, ``--help`` for the usage) and exit status 2."""
    parser = getattr(ex, "subcommand_parser", None) or parser
    prog = " ".join(["lightning-unlearn", *parser.prog.replace(" [options]", "").split()[1:]])
    sys.stderr.write(f"{prog}: error: {parse_error_line(message, parser)} (`{prog} --help` lists the options)\n")
    raise SystemExit(2)
