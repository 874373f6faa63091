"""``python -m controller_runtime``: start a project, add APIs, generate its manifests.

::

    python -m controller_runtime init --domain example.com --name my-operator
    python -m controller_runtime create api --group shop --version v1 --kind Widget
    python -m controller_runtime create webhook --group shop --version v1 --kind Widget \
        --defaulting --programmatic-validation [--conversion]
    python -m controller_runtime manifests [--check]

``init`` and ``create`` work in the current directory (``--dir`` for another); see
``docs/controllers.md``. ``manifests`` regenerates the CRDs and RBAC that
``[tool.controller-runtime]`` in ``pyproject.toml`` describes
(:mod:`controller_runtime.manifests`).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m controller_runtime",
        description=__doc__.split("\n")[0],
        allow_abbrev=False,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    init = commands.add_parser("init", help="make a new operator project", allow_abbrev=False)
    init.add_argument("--domain", required=True, help="the API groups' suffix, e.g. example.com")
    init.add_argument("--name", required=True, help="the project's name, e.g. my-operator")
    init.add_argument("--dir", type=Path, default=Path.cwd(), help="where (default: here)")
    init.add_argument(
        "--library",
        default="",
        help="the requirement for this library in pyproject.toml (default: this version)",
    )

    create = commands.add_parser(
        "create", help="add an API or a webhook to the project", allow_abbrev=False
    )
    kinds = create.add_subparsers(dest="what", required=True, metavar="WHAT")
    for what, text in (("api", "a typed resource and its controller"), ("webhook", "webhooks")):
        sub = kinds.add_parser(what, help=f"add {text}", allow_abbrev=False)
        sub.add_argument("--group", required=True, help="e.g. shop (the domain is appended)")
        sub.add_argument("--version", required=True, help="e.g. v1")
        sub.add_argument("--kind", required=True, help="e.g. Widget")
        sub.add_argument("--dir", type=Path, default=Path.cwd())
        if what == "api":
            sub.add_argument("--cluster-scoped", action="store_true", help="a cluster-scoped kind")
        else:
            sub.add_argument("--defaulting", action="store_true", help="a defaulter")
            sub.add_argument(
                "--programmatic-validation",
                "--validation",
                dest="validation",
                action="store_true",
                help="a validator",
            )
            sub.add_argument(
                "--conversion",
                action="store_true",
                help="a converter between the kind's versions (create api a second one first)",
            )

    manifests = commands.add_parser(
        "manifests", help="regenerate the CRDs and RBAC", allow_abbrev=False
    )
    manifests.add_argument("--dir", type=Path, default=Path.cwd())
    manifests.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if anything is stale"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "manifests":
        from controller_runtime.manifests import run  # noqa: PLC0415 (per command)

        return asyncio.run(run(args.dir.resolve(), check=args.check))
    from controller_runtime import scaffold  # noqa: PLC0415 (per command)

    try:
        if args.command == "init":
            written = scaffold.init(
                args.dir, domain=args.domain, name=args.name, library=args.library or None
            )
        elif args.what == "api":
            written = scaffold.create_api(
                args.dir,
                group=args.group,
                version=args.version,
                kind=args.kind,
                namespaced=not args.cluster_scoped,
            )
        else:
            written = scaffold.create_webhook(
                args.dir,
                group=args.group,
                version=args.version,
                kind=args.kind,
                defaulting=args.defaulting,
                validation=args.validation,
                conversion=args.conversion,
            )
    except scaffold.ScaffoldError as err:
        print(f"{args.command}: {err}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
