"""A command line generated from a config dataclass: one flag per field, its help from
the field's metadata, its default shown for every preset, choices where the field has
them. Nothing here imports torch, so --help works on a machine without it."""

import argparse
import dataclasses

from core.errors import UsageError


class _OneLineParser(argparse.ArgumentParser):
    make_variables: dict = {}

    def error(self, message):  # argparse would print the usage and exit
        # A flag that make sets from a variable is named as the user typed it too.
        for flag, variable in self.make_variables.items():
            if message.startswith(f"argument {flag}"):
                message += f" (make's {variable}=)"
                break
        raise UsageError(message)


def option(default, help: str, choices=None, aliases=()):
    """A config field with its help text (and choices, and other spellings of its flag)."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices,
                                                        "aliases": aliases})


def _default_text(f, presets: dict) -> str:
    by_preset = [f"{name} preset {values[f.name]}" for name, values in presets.items()
                 if f.name in values]
    return f"default {f.default}" + (f"; {', '.join(by_preset)}" if by_preset else "")


def config_parser(config_cls, presets: dict, description: str, make_variables=None
                  ) -> argparse.ArgumentParser:
    """Flags of config_cls; a flag left out is absent from the parsed namespace, so the
    preset and then the dataclass supply it. make_variables: {flag: the Makefile variable
    that sets it}, named in the flag's errors."""
    # Options exactly as spelled: a prefix must not slip past a check on the full name.
    parser = _OneLineParser(description=description, allow_abbrev=False)
    parser.make_variables = make_variables or {}
    for f in dataclasses.fields(config_cls):
        meta = f.metadata
        flags = ["--" + f.name.replace("_", "-"), *meta.get("aliases", ())]
        help_text = f"{meta.get('help', '')} ({_default_text(f, presets)})"
        if f.type in (bool, "bool"):
            parser.add_argument(*flags, dest=f.name, action=argparse.BooleanOptionalAction,
                                default=argparse.SUPPRESS, help=help_text)
        else:
            parser.add_argument(*flags, dest=f.name, type=type(f.default),
                                choices=meta.get("choices"), default=argparse.SUPPRESS,
                                help=help_text)
    return parser
