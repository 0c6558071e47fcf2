"""The ``zoo`` command.

    zoo                      every preset in a table (parameters, layers, width, components)
    zoo list                 registered components by kind, families, presets
    zoo show SPEC [--set k=v ...]   the resolved spec as YAML
    zoo schema               JSON Schema of spec files

SPEC is a preset name or a YAML file. Every failure prints one line and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table

import zoo
from zoo.registry import REGISTRIES, RegistryError
from zoo.spec import SpecError


def _components(spec) -> str:
    b = spec.block
    att = b.attention
    heads = f"{att.kind} {att.n_heads}h" + (f"/{att.kv_heads}kv" if att.kv_heads != att.n_heads else "")
    return f"{spec.position.kind}, {heads}, {b.ffn.kind}, {b.norm.kind} {spec.norm_placement}"


def presets_table() -> Table:
    table = Table(title="zoo presets")
    for col, just in (("preset", "left"), ("family", "left"), ("parameters", "right"), ("layers", "right"),
                      ("d_model", "right"), ("components", "left")):
        table.add_column(col, justify=just)
    for name in zoo.preset_names():
        spec = zoo.load_spec(name)
        model = zoo.build(spec, device="meta")
        layers = (f"{spec.encoder_layers}+{spec.decoder_layers}" if spec.family == "encoder_decoder" else str(spec.n_layers))
        table.add_row(name, spec.family, f"{zoo.count_parameters(model):,}", layers, str(spec.d_model), _components(spec))
    return table


def _list(console: Console) -> None:
    for part, reg in REGISTRIES.items():
        console.print(f"[bold]{part}[/]: {', '.join(reg.names())}")
    console.print(f"[bold]presets[/]: {', '.join(zoo.preset_names())}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="zoo", description="A configurable Transformer architecture zoo.")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("presets", help="every preset in a table (the default)")
    sub.add_parser("list", help="registered components, families and presets")
    show = sub.add_parser("show", help="the resolved spec as YAML")
    show.add_argument("spec", help="a preset name or a YAML file")
    show.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                      help="override a field, e.g. --set block.attention.n_heads=4 (repeatable)")
    sub.add_parser("schema", help="JSON Schema of spec files")
    args = parser.parse_args(argv)
    console = Console(width=max(Console().width, 140))
    try:
        if args.command in (None, "presets"):
            console.print(presets_table())
        elif args.command == "list":
            _list(console)
        elif args.command == "show":
            sys.stdout.write(zoo.to_yaml(zoo.load_spec(args.spec, args.overrides)))
        elif args.command == "schema":
            sys.stdout.write(json.dumps(zoo.json_schema(), indent=2) + "\n")
    except (SpecError, RegistryError) as e:
        print(f"zoo: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
