"""Print the configuration reference (every ARPO config field, its default and its doc), or
write it into docs/configuration.md between its markers.

    python scripts/config_reference.py           # print
    python scripts/config_reference.py --write   # update docs/configuration.md
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from rllib_arpo.config.reference import config_reference

REFERENCE_PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
BLOCK = re.compile(r"(<!-- BEGIN CONFIG REFERENCE[^>]*-->\n)(.*?)(<!-- END CONFIG REFERENCE -->)", re.DOTALL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="replace the block in docs/configuration.md")
    args = parser.parse_args()
    if not args.write:
        print(config_reference(), end="")
        return
    text = REFERENCE_PAGE.read_text()
    if not BLOCK.search(text):
        raise SystemExit(
            f"{REFERENCE_PAGE} has no '<!-- BEGIN CONFIG REFERENCE ... -->' ... '<!-- END CONFIG REFERENCE -->' block"
        )
    REFERENCE_PAGE.write_text(BLOCK.sub(lambda m: m.group(1) + config_reference() + m.group(3), text))
    print(f"updated the configuration reference in {REFERENCE_PAGE}")


if __name__ == "__main__":
    main()
