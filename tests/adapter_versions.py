"""Adapter versions made in-process from a PEFT folder, as an upload's two files make them."""

from pathlib import Path


def create_version(adapter, folder: Path, *, actor: str = "test"):
    """The version `folder`'s adapter_config.json and adapter_model.safetensors upload as
    (created, not validated: `pending`, its validation queued on commit)."""
    from registry.services.versions import adapter_version_create

    with (
        open(folder / "adapter_config.json", "rb") as config,
        open(folder / "adapter_model.safetensors", "rb") as weights,
    ):
        version, _ = adapter_version_create(
            adapter=adapter, config=config, weights=weights, actor=actor
        )
    return version


def create_ready_version(adapter, folder: Path, *, actor: str = "test"):
    """The same, validated here (the worker's service, called directly): `ready`."""
    from registry.services.versions import adapter_version_validate

    version = adapter_version_validate(version_id=create_version(adapter, folder, actor=actor).pk)
    assert version is not None and version.status == "ready", version
    return version
