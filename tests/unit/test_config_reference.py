import re
from pathlib import Path

from rllib_arpo.config.reference import config_reference

REFERENCE_PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_the_docs_hold_the_generated_configuration_reference():
    text = REFERENCE_PAGE.read_text()
    block = re.search(r"<!-- BEGIN CONFIG REFERENCE[^>]*-->\n(.*?)<!-- END CONFIG REFERENCE -->", text, re.DOTALL)
    assert block is not None, "docs/configuration.md lost its configuration reference markers"
    assert block.group(1) == config_reference(), (
        "docs/configuration.md is stale: run python scripts/config_reference.py --write"
    )


def test_the_reference_lists_every_rollout_field_with_its_default_and_doc():
    reference = config_reference()
    assert "| `total_rollouts` | `16` | [M] trajectories per prompt. |" in reference
    assert '| `branching_mode` | `"stochastic"` |' in reference
    assert '| `multi_tool_set` | `["search", "python"]` |' in reference
