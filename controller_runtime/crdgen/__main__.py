"""``python -m controller_runtime.crdgen MODULE... --output-dir DIR [--check]``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from controller_runtime.crdgen import CrdError, SchemaError, discover, render_all, sync


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m controller_runtime.crdgen",
        description="Write the CRDs of the typed resource classes in MODULE(s) as YAML.",
        allow_abbrev=False,
    )
    parser.add_argument("modules", nargs="+", metavar="MODULE", help="e.g. my_operator.api")
    parser.add_argument(
        "--output-dir", "-o", type=Path, required=True, help="where the YAML files go"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="change nothing; exit 1 if the files differ from what the classes give",
    )
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path.cwd()))
    try:
        classes = discover(args.modules)
        files = render_all(classes)
    except (CrdError, SchemaError, ImportError) as err:
        print(f"crdgen: {err}", file=sys.stderr)
        return 2
    if not classes:
        print(f"crdgen: no @crd classes in {', '.join(args.modules)}", file=sys.stderr)
        return 2
    differing = sync(files, args.output_dir, check=args.check)
    if args.check:
        if differing:
            print(
                f"crdgen: {args.output_dir} is out of date ({', '.join(differing)}); "
                f"run python -m controller_runtime.crdgen {' '.join(args.modules)} "
                f"--output-dir {args.output_dir}",
                file=sys.stderr,
            )
            return 1
        return 0
    for name in differing:
        verb = "removed" if name.startswith("-") else "wrote"
        print(f"{verb} {args.output_dir / name.lstrip('-')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
