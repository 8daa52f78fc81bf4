"""Quantized base models at import: a scheme the engine serves is recorded with its name and
in the fingerprint, one it cannot serve (or a checkpoint that is not what its config.json
says) is refused at import with the reason, and a quantized checkpoint of a served base is a
new revision: every adapter version on it is re-checked and re-evaluated there."""

import json
import shutil

import pytest
import torch
from django.core.management import CommandError, call_command
from django.test import Client
from safetensors.torch import load_file, save_file

from audit.models import AuditEvent
from registry.errors import NotServable
from registry.models import BaseModel, Evaluation
from registry.selectors import adapter_version_resolve
from registry.services.base_models import base_model_import, base_model_recheck
from tests.quantized.configs import FP8_DYNAMIC, quant_args, w4a16
from tests.registry.conftest import (
    BASE_NAME,
    attach_eval_set,
    make_ready_version,
    run_evaluations,
)

pytestmark = pytest.mark.django_db
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _fp8(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """FP8 e4m3 weights with a scale per output channel, as float-quantized stores them."""
    scale = weight.abs().amax(dim=1, keepdim=True) / torch.finfo(torch.float8_e4m3fn).max
    return {
        "weight": (weight / scale).to(torch.float8_e4m3fn),
        "weight_scale": scale.to(torch.float32),
    }


def _w4_group(weight: torch.Tensor, group_size: int) -> dict[str, torch.Tensor]:
    """Symmetric 4-bit ints in groups of the input columns, eight to an int32 along the
    inputs (value + 8 in the low bits first), as pack-quantized stores them."""
    out, n_in = weight.shape
    groups = weight.reshape(out, n_in // group_size, group_size)
    scale = groups.abs().amax(dim=2) / 7
    q = torch.round(groups / scale[..., None]).clamp(-8, 7).to(torch.int64).reshape(out, n_in)
    unsigned = (q + 8).reshape(out, n_in // 8, 8)
    packed = sum(unsigned[..., i] << (4 * i) for i in range(8))
    return {
        "weight_packed": torch.as_tensor(packed, dtype=torch.int64).to(torch.int32),
        "weight_scale": scale.to(torch.float32),
        "weight_shape": torch.tensor([out, n_in], dtype=torch.int32),
    }


def quantized_copy(base_dir, out, quantization: dict, quantize) -> object:
    """`base_dir` with every layer linear stored by `quantize` and its config.json declaring
    `quantization`: a checkpoint of the same model, as a quantizer saves one."""
    shutil.copytree(base_dir, out)
    tensors = load_file(out / "model.safetensors")
    for name in [n for n in tensors if n.endswith(".weight") and n.split(".")[-2] in LINEARS]:
        module = name.removesuffix(".weight")
        stored = quantize(tensors.pop(name))
        tensors |= {f"{module}.{suffix}": t.contiguous() for suffix, t in stored.items()}
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config | {"quantization_config": quantization}))
    return out


@pytest.fixture(scope="module")
def fp8_dir(tiny_base_dir, tmp_path_factory):
    return quantized_copy(tiny_base_dir, tmp_path_factory.mktemp("q") / "fp8", FP8_DYNAMIC, _fp8)


@pytest.fixture(scope="module")
def w4_dir(tiny_base_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("q") / "w4"
    return quantized_copy(tiny_base_dir, out, w4a16(32), lambda w: _w4_group(w, 32))


def test_a_served_scheme_is_imported_with_its_name_and_in_its_fingerprint(
    w4_dir, tiny_base_dir, capsys
):
    call_command("import_base_model", "--hf-dir", str(w4_dir), "--name", "tiny-w4")
    row = BaseModel.objects.get(name="tiny-w4")
    assert row.quantization == "w4a16-g32"
    assert row.fingerprint["quantization"]["weights"] == {
        "bits": 4,
        "type": "int",
        "granularity": "group",
        "group_size": 32,
        "symmetric": True,
        "actorder": False,
    }
    assert "revision" in (out := capsys.readouterr().out) and "(w4a16-g32)" in out
    call_command("import_base_model", "--hf-dir", str(tiny_base_dir), "--name", "tiny-float")
    plain = BaseModel.objects.get(name="tiny-float")
    assert plain.quantization == "" and "quantization" not in plain.fingerprint
    same_shapes = {k: v for k, v in row.fingerprint.items() if k != "quantization"}
    assert same_shapes == plain.fingerprint and row.fingerprint != plain.fingerprint


def _edit_config(folder, out, edit):
    shutil.copytree(folder, out)
    config = json.loads((out / "config.json").read_text())
    edit(config["quantization_config"]["config_groups"]["group_0"]["weights"], config)
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda w, c: w.update(num_bits=3), "3-bit int weights are not served (4 or 8-bit only)"),
        (lambda w, c: w.update(group_size=96), "group size 96 is not served"),
        (
            lambda w, c: c["quantization_config"].update(quant_method="hqq"),
            "quant_method 'hqq' is not served",
        ),
        (
            lambda w, c: c["quantization_config"].update(kv_cache_scheme=quant_args(type="float")),
            "KV-cache quantization",
        ),
        # the config and tensors agree, but 64-input linears are not whole groups of 128
        (lambda w, c: w.update(group_size=128), "group size 128 does not divide its inputs"),
        # groups of 64 are served, but the checkpoint's scales are for groups of 32
        (
            lambda w, c: w.update(group_size=64),
            "'model.layers.0.self_attn.q_proj.weight_scale' has shape [64, 2]",
        ),
    ],
)
def test_what_the_engine_cannot_serve_is_refused_at_import_with_the_reason(
    w4_dir, tmp_path, edit, words
):
    folder = _edit_config(w4_dir, tmp_path / "bad", edit)
    with pytest.raises(CommandError) as info:
        call_command("import_base_model", "--hf-dir", str(folder), "--name", "refused")
    assert words in str(info.value)
    assert BaseModel.objects.count() == 0


def test_a_checkpoint_without_the_declared_tensors_is_refused(tiny_base_dir, tmp_path):
    """A bf16 folder whose config.json claims FP8: refused at import, never failed at serve."""
    folder = shutil.copytree(tiny_base_dir, tmp_path / "claims-fp8")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"quantization_config": FP8_DYNAMIC}))
    words = "'model.layers.0.self_attn.q_proj.weight' is F32; fp8-dynamic stores F8_E4M3"
    with pytest.raises(CommandError, match=words):
        call_command("import_base_model", "--hf-dir", str(folder), "--name", "refused")


def test_a_quantized_revision_of_a_base_reevaluates_every_version_on_it(
    tenant_a, adapter, good_adapter_dir, fp8_dir, scorer, alice
):
    attach_eval_set(adapter)
    version = make_ready_version(adapter, good_adapter_dir)
    run_evaluations()
    bf16 = BaseModel.objects.get(name=BASE_NAME)
    base, changed = base_model_import(name=BASE_NAME, path=fp8_dir)
    assert changed and base.revision != bf16.revision and base.quantization == "fp8-dynamic"
    assert base.fingerprint != bf16.fingerprint
    with pytest.raises(NotServable, match="not been checked"):
        adapter_version_resolve(tenant=tenant_a, adapter_name="support-bot")

    # the adapter's tensors fit the FP8 base (same shapes); its quality is measured again
    assert base_model_recheck(base_model_id=base.pk) == {"compatible": 1, "incompatible": 0}
    with pytest.raises(NotServable, match="evaluation pending on revision"):
        adapter_version_resolve(tenant=tenant_a, adapter_name="support-bot")
    rerun = Evaluation.objects.get(version=version, base_revision=base.revision)
    assert rerun.trigger == Evaluation.Trigger.BASE_UPGRADE
    assert rerun.base_quantization == "fp8-dynamic"
    run_evaluations()
    assert adapter_version_resolve(tenant=tenant_a, adapter_name="support-bot").pk == version.pk
    assert AuditEvent.objects.filter(verb="version.compatible").exists()
    by_revision = dict(version.evaluations.values_list("base_revision", "base_quantization"))
    assert by_revision == {bf16.revision: "", base.revision: "fp8-dynamic"}

    client = Client()
    client.force_login(alice)
    html = client.get("/adapters/support-bot/").content.decode()
    block = html.split('id="evaluation-v1"')[1].split("</div>")[0]
    assert f"{base.revision[:12]}" in block and "(fp8-dynamic)" in block
