"""docs/api.md is what tests/apidoc.py generates from the code; every public name is documented."""

from __future__ import annotations

import difflib

import pytest

from tests.apidoc import (
    API_MD,
    COMMAND,
    MODULES,
    Name,
    documentation,
    generate,
    is_type_alias,
    public_names,
)

PUBLIC = [item for module in MODULES for item in public_names(module)]


def test_api_md_is_generated_from_the_current_docstrings() -> None:
    expected = generate()
    committed = API_MD.read_text() if API_MD.exists() else ""
    if committed != expected:
        diff = difflib.unified_diff(
            committed.splitlines(), expected.splitlines(), "docs/api.md", "generated", lineterm=""
        )
        shown = "\n".join(list(diff)[:60])
        pytest.fail(f"docs/api.md is out of date: run `{COMMAND}` to update it\n{shown}")


@pytest.mark.parametrize("item", PUBLIC, ids=lambda item: f"{item.module}.{item.name}")
def test_every_public_name_is_documented(item: Name) -> None:
    # A type alias without a '#:' comment is documented by its definition, shown on the page.
    assert documentation(item) or is_type_alias(item.obj), (
        f"{item.module}.{item.name} has no documentation: give it a docstring (a class or "
        f"function) or a '#:' comment above its assignment in {item.source} (a constant)"
    )


def test_the_public_names_are_the_curated_exports() -> None:
    names = {f"{item.module}.{item.name}" for item in PUBLIC}
    assert {"otpmesh.start", "otpmesh.chaos.ChaosMonkey", "otpmesh.rdma.RDMABuffer"} <= names
    assert "otpmesh.testing.SupervisionMachine" in names  # the lazy (hypothesis) names too
    assert not any(name.split(".")[-1].startswith("_") for name in names)
    assert "otpmesh.testing.TYPE_CHECKING" not in names and "otpmesh.chaos" not in names
