"""docs/architecture.md's layer diagram is the graph CMakeLists.txt declares (scripts/layer_diagram.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

import layer_diagram  # noqa: E402


def test_diagram_matches_the_declared_graph():
    expected = layer_diagram.block(
        layer_diagram.diagram(layer_diagram.declared_layers((REPO / "CMakeLists.txt").read_text(encoding="utf-8"))))
    shown = layer_diagram.documented((REPO / "docs" / "architecture.md").read_text(encoding="utf-8"))
    assert shown == expected, "run scripts/layer_diagram.py --write"


def test_every_declared_folder_is_drawn_with_its_deps():
    layers = layer_diagram.declared_layers((REPO / "CMakeLists.txt").read_text(encoding="utf-8"))
    lines = layer_diagram.diagram(layers).splitlines()
    for folder, deps in layers:
        drawn = [line for line in lines if line.split()[2:3] == [folder + "/"]]
        assert len(drawn) == 1, folder
        assert drawn[0].split()[4:] == deps, folder


def test_a_changed_declaration_changes_the_diagram():
    text = (REPO / "CMakeLists.txt").read_text(encoding="utf-8")
    changed = text.replace("mx2nv_layer(inspect DEPS scan gate", "mx2nv_layer(inspect DEPS scan gate report", 1)
    assert changed != text
    assert layer_diagram.diagram(layer_diagram.declared_layers(changed)) != layer_diagram.diagram(
        layer_diagram.declared_layers(text))


def test_a_forward_dependency_is_refused():
    with pytest.raises(ValueError, match="not declared before it"):
        layer_diagram.diagram([("json", ["common"]), ("common", [])])
