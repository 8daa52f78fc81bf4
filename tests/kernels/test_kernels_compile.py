"""Every Triton kernel variant the engine can launch compiles for Hopper (sm_90) and Ampere
(sm_80), with the local Triton and with Triton 3.6 (what older GPU images ship), checked on
a host without a GPU.

The interpreter the other kernel tests run under accepts code, tiles, warp counts and
pipeline depths that the GPU compiler or the device refuse. So the launches are made
through the engine's own wrappers (each gets the specialisation a real launch would) at
the shapes of the models the engine serves, and every distinct variant is compiled through
ptxas: it must compile, fit the target's shared memory and not spill registers past the
limit of its dtype (compilation/resources.py). It runs in a child process: TRITON_INTERPRET,
set for the other kernel tests, would make the kernels uncompilable, and the older Triton
goes ahead of the venv's own on its PYTHONPATH.

Compiling all ~2,800 variants afresh takes about 10 minutes per Triton on two cores, so the
check keeps a record of what compiling found (tests/kernels/compiled/, one file per Triton,
compilation/records.py): a variant whose kernel source, launch key, target and Triton are
unchanged is read from it, every other one is compiled, and the first recorded variant of
each kernel and dtype is compiled again and must agree with the record. After changing a
kernel, rewrite the record (and review its diff):

    python -m inference.kernels.compilation --arch 90 --arch 80 --dtype bfloat16 \
        --dtype float16 --dtype float32 --table-dtype bfloat16 --jobs 2 --quant \
        --records tests/kernels/compiled --write-records

(with PYTHONPATH=.venv/triton-3.6:. for Triton 3.6's).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fresh_python import ROOT

KERNELS = {
    "sgmv_shrink_kernel",
    "bgmv_shrink_kernel",
    "sgmv_expand_kernel",
    "bgmv_expand_kernel",
    "paged_decode_kernel",
    "paged_decode_reduce_kernel",
    "paged_extend_kernel",
    "int_weight_gemm_kernel",
    "fp8_quantize_rows_kernel",
    "fp8_gemm_kernel",
    "fp8_weight_only_gemm_kernel",
}
# Before sm_89 there are no fp8 dots: FP8 layers run weight-only there (quant_ops.py)
FP8_DOTS = {"fp8_quantize_rows_kernel", "fp8_gemm_kernel"}
# The Makefile installs it here (`pip install --target`, triton only)
TRITON_3_6 = Path(sys.prefix, "triton-3.6")
RECORDS = ROOT / "tests" / "kernels" / "compiled"
# Every variant of the served models, in the three dtypes, with the quantized-base GEMMs of
# the default schemes, and every tile-table entry
COMMAND = ["--arch", "90", "--arch", "80", "--dtype", "bfloat16", "--dtype", "float16",
           "--dtype", "float32", "--table-dtype", "bfloat16", "--jobs", "2", "--quant",
           "--records", str(RECORDS)]  # fmt: skip
# One small deployment, for the record's own checks
SMALL = ["--arch", "90", "--model", "llama-3-8b", "--tp", "8", "--rank", "8", "--jobs", "1"]


def _compile_table(tmp_path: Path, triton_path: Path | None,
                   command: list[str] = COMMAND) -> tuple[dict, str]:  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([*([str(triton_path)] if triton_path else []), str(ROOT)])
    out = tmp_path / "table.json"
    done = subprocess.run(
        [sys.executable, "-m", "inference.kernels.compilation", *command, "--json", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    output = done.stdout[-6000:] + done.stderr[-4000:]
    assert out.is_file(), output
    table = json.loads(out.read_text())
    assert done.returncode == 0 or any(row["problems"] for row in table["variants"]), output
    return table, output


def _check(table: dict, output: str) -> None:
    failing = [row for row in table["variants"] if row["problems"]]
    assert not failing, output
    for target in ("sm_90", "sm_80"):
        compiled = {row["kernel"] for row in table["variants"] if row["target"] == target}
        expected = KERNELS if target == "sm_90" else KERNELS - FP8_DOTS
        assert compiled == expected, (target, expected ^ compiled)
        dtypes = {row["dtype"] for row in table["variants"] if row["target"] == target}
        assert dtypes == {"bfloat16", "float16", "float32"}, (target, dtypes)
    # The record was checked: each kernel, target and dtype had a variant compiled here
    for group in table["summary"]:
        assert group["compiled"] >= 1, group


@pytest.mark.parametrize("version", ["local", "3.6"])
def test_every_kernel_variant_compiles_for_hopper_and_ampere(tmp_path, version):
    import triton

    if version == "local":
        table, output = _compile_table(tmp_path, None)
        assert table["triton"] == triton.__version__
    else:
        if not (TRITON_3_6 / ".installed").is_file():
            pytest.skip(f"Triton 3.6 is not installed in {TRITON_3_6} (the Makefile installs it)")
        table, output = _compile_table(tmp_path, TRITON_3_6)
        assert table["triton"].startswith("3.6."), table["triton"]
    _check(table, output)


def test_a_record_that_disagrees_with_the_compiler_fails_the_check(tmp_path):
    records = tmp_path / "records"
    first, output = _compile_table(tmp_path, None, [*SMALL, "--records", str(records),
                                                    "--write-records"])  # fmt: skip
    assert not [row for row in first["variants"] if row["problems"]], output
    (record,) = records.iterdir()
    data = json.loads(record.read_text())
    assert len(data["variants"]) == len(first["variants"])
    # Every recorded figure made smaller than what ptxas reports
    data["variants"] = {fp: [*v[:3], 0, 0, 0, 0] for fp, v in data["variants"].items()}
    record.write_text(json.dumps(data))
    second, output = _compile_table(tmp_path, None, [*SMALL, "--records", str(records)])
    assert any(row["source"] == "recorded" for row in second["variants"]), output
    disagreeing = {row["kernel"] for row in second["variants"]
                   if any("the record says" in p for p in row["problems"])}  # fmt: skip
    assert disagreeing == {row["kernel"] for row in first["variants"]}, output
