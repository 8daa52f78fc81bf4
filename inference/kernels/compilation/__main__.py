"""Compile every kernel variant the engine can launch, for GPUs that are not here, and
print the compile table; exit 1 if a variant fails to compile, needs more shared memory
than its target has, or spills past the limit (resources.py).

    python -m inference.kernels.compilation --arch 90 --arch 80 --jobs 2 --json out.json

With `--records DIR`, the variants DIR's record for this Triton has (records.py) are not
compiled again, but one of each kernel and dtype; `--write-records` rewrites that record
from this run.
"""

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import triton

from inference.kernels.lora_tiles import DEFAULT_TABLE, table_for_gpu

from .parallel import compile_sharded
from .shapes import LORA_RANKS, MODELS, TENSOR_PARALLEL, deployments
from .variants import DEFAULT_QUANT_SCHEMES, check_quant_schemes

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inference.kernels.compilation")
    parser.add_argument("--arch", type=int, action="append", help="90 (Hopper), 80 (Ampere)")
    parser.add_argument("--dtype", action="append", choices=sorted(DTYPES))
    parser.add_argument("--model", action="append", choices=[m.name for m in MODELS])
    parser.add_argument("--tp", type=int, action="append", help="tensor-parallel sizes")
    parser.add_argument("--rank", type=int, action="append", help="max_lora_rank values")
    parser.add_argument("--gpu", help="the GPU whose tuned tile table to use (default: none)")
    parser.add_argument("--table-dtype", action="append", choices=sorted(DTYPES),
                        help="also compile every tile-table entry in this dtype")  # fmt: skip
    parser.add_argument("--quant", nargs="*", metavar="SCHEME",
                        help="also the quantized-base GEMMs of these schemes (none named: "
                             f"{' '.join(DEFAULT_QUANT_SCHEMES)}; see variants.py)")  # fmt: skip
    parser.add_argument("--jobs", type=int, default=1, help="compiling processes")
    parser.add_argument("--json", metavar="FILE", help="write the rows and summary here")
    parser.add_argument("--records", metavar="DIR", type=Path,
                        help="reuse DIR's record for this Triton (records.py)")  # fmt: skip
    parser.add_argument("--write-records", action="store_true",
                        help="rewrite that record from this run (with --records)")  # fmt: skip
    args = parser.parse_args(argv)

    from .records import load_record, record_path, write_record
    from .report import format_summary, summary

    if args.write_records and not args.records:
        parser.error("--write-records needs --records DIR")
    record = record_path(args.records) if args.records else None
    known = load_record(record) if record else {}

    models = tuple(m for m in MODELS if not args.model or m.name in args.model)
    dtypes = tuple(DTYPES[d] for d in args.dtype or ["bfloat16"])
    shapes = deployments(dtypes, models, tuple(args.tp or TENSOR_PARALLEL),
                         tuple(args.rank or LORA_RANKS))  # fmt: skip
    if args.quant is not None:
        try:
            schemes = check_quant_schemes(tuple(args.quant) or DEFAULT_QUANT_SCHEMES)
        except ValueError as error:
            parser.error(str(error))
        shapes = [replace(s, quant_schemes=schemes) for s in shapes]
    table = table_for_gpu(args.gpu) if args.gpu else DEFAULT_TABLE
    table_dtypes = [DTYPES[d] for d in args.table_dtype or []]
    table_rows: list[dict[str, Any]] = []
    for arch in args.arch or [90, 80]:
        table_rows += compile_sharded(arch, shapes, table, table_dtypes, args.jobs, known=known)
    groups = summary(table_rows)
    print(f"triton {triton.__version__}")
    print(format_summary(groups))
    failed = [row for row in table_rows if row["problems"]]
    for row in failed:
        where = f"{row['kernel']} {row['target']} {row['dtype']} {row['constexprs']}"
        print(f"FAIL {where} {row['options']} ({row['first_launched_by']}): "
              f"{'; '.join(row['problems'])}")  # fmt: skip
    seconds = sum(row["compile_seconds"] for row in table_rows)
    compiled = sum(row["source"] == "compiled" for row in table_rows)
    print(f"{len(table_rows)} variants ({compiled} compiled, the others as {record} records "
          f"them), {seconds:.1f} s of compiling, {len(failed)} failing")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"triton": triton.__version__, "record": str(record), "summary": groups,
                       "variants": table_rows}, f, indent=1, default=str)  # fmt: skip
    if args.write_records and record is not None and not failed:
        print(f"{write_record(record, table_rows)} variants recorded in {record}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
