"""Load-time checks of media modules: modalities against the input schema's media forms."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

from proxy.module.loader import ModuleLoadError, load_module
from tests.conftest import MODULES

MEDIA_REF = {
    "type": "object",
    "properties": {"photo": {"$ref": "#/$defs/MediaInput"}},
}
MEDIA_DEFS = {
    "MediaInput": {
        "type": "object",
        "oneOf": [
            {
                "properties": {"type": {"const": "url"}, "url": {"type": "string"}},
                "required": ["type", "url"],
            },
            {
                "properties": {"type": {"const": "file"}, "path": {"type": "string"}},
                "required": ["type", "path"],
            },
        ],
    }
}


def module_with(tmp_path: Path, modalities: list[str] | None, input_schema: Mapping[str, object]) -> Path:
    root = tmp_path / "image-describer"
    shutil.copytree(MODULES / "image-describer", root)
    manifest = yaml.safe_load((root / "module.yaml").read_text())
    if modalities is None:
        manifest.pop("modalities")
    else:
        manifest["modalities"] = {"input": modalities}
    (root / "module.yaml").write_text(yaml.safe_dump(manifest))
    schema = json.loads((root / "schema.json").read_text())
    schema["input"] = input_schema
    schema["$defs"] = MEDIA_DEFS
    (root / "schema.json").write_text(json.dumps(schema))
    return root


def test_media_forms_through_a_ref_need_a_media_modality(tmp_path: Path) -> None:
    with pytest.raises(ModuleLoadError) as caught:
        load_module(module_with(tmp_path, None, MEDIA_REF))
    message = str(caught.value)
    assert "module 'image-describer'" in message and "schema.json#/input/properties/photo" in message
    assert load_module(module_with(tmp_path / "ok", ["text", "image"], MEDIA_REF)).takes_media


def test_a_media_modality_needs_a_media_input(tmp_path: Path) -> None:
    plain = {"type": "object", "properties": {"prompt": {"type": "string"}}}
    with pytest.raises(ModuleLoadError) as caught:
        load_module(module_with(tmp_path, ["text", "audio"], plain))
    assert "modalities.input declares audio" in str(caught.value)


def test_an_unknown_modality_is_refused_by_the_manifest_schema(tmp_path: Path) -> None:
    with pytest.raises(ModuleLoadError, match="modalities"):
        load_module(module_with(tmp_path, ["text", "smell"], MEDIA_REF))


def test_text_modules_are_unchanged() -> None:
    module = load_module(MODULES / "code-reviewer")
    assert module.input_modalities == frozenset({"text"}) and not module.takes_media
    assert load_module(MODULES / "image-describer").input_modalities == frozenset({"text", "image"})
