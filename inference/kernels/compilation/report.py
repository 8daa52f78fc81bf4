"""The compile table: a row per compiled variant (what it is, what it costs, why it could
not launch), and a summary per kernel and target."""

from typing import Any

from .compile import Compilation
from .resources import problems, resources


def rows(compilation: Compilation, arch: int) -> list[dict[str, Any]]:
    """A row per variant this compilation built (or failed to build, or found recorded)."""
    out = []
    for key, v in compilation.variants.items():
        if not v.reported:
            continue  # another shard's
        row: dict[str, Any] = {
            "kernel": key.kernel,
            "target": f"sm_{arch}",
            "dtype": key.dtype,
            "constexprs": {k: v for k, v in key.constexprs},
            "options": {k: v for k, v in key.options},
            "first_launched_by": v.shapes,
            "compile_seconds": round(v.seconds, 3),
            "fingerprint": v.fingerprint,
            "source": "compiled" if v.kernel is not None or v.error else "recorded",
        }
        if v.error is not None:
            row["problems"] = [f"does not compile: {v.error}"]
            out.append(row)
            continue
        disagreement: list[str] = []
        if v.kernel is None:
            assert v.recorded is not None
            found = v.recorded
        else:
            kernel = v.kernel.result() if hasattr(v.kernel, "result") else v.kernel
            found = resources(kernel, arch)
            if v.recorded is not None and v.recorded != found:
                disagreement = [f"the record says {v.recorded}, compiling found {found}"]
        row |= {
            "shared": found.shared,
            "registers": found.registers,
            "spill_stores": found.spill_stores,
            "spill_loads": found.spill_loads,
            "problems": disagreement + problems(found, arch, key.dtype),
        }
        out.append(row)
    return out


def failures(compilation: Compilation) -> list[dict[str, Any]]:
    """A row per variant that did not compile, with the error."""
    return [
        {"kernel": key.kernel, "describe": key.describe(), "problems": [v.error]}
        for key, v in compilation.variants.items()
        if v.error is not None
    ]


def summary(table: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (kernel, target, dtype): variants, most shared memory, most spilled bytes."""
    groups: dict[tuple[str, str, str], dict[str, Any]] = {}
    for row in table:
        group = groups.setdefault(
            (row["kernel"], row["target"], row["dtype"]),
            {"kernel": row["kernel"], "target": row["target"], "dtype": row["dtype"],
             "variants": 0, "compiled": 0, "max_shared": 0, "max_spills": 0, "failures": 0},
        )  # fmt: skip
        group["variants"] += 1
        group["compiled"] += row.get("source", "compiled") == "compiled"
        group["max_shared"] = max(group["max_shared"], row.get("shared", 0))
        spills = max(row.get("spill_stores", 0), row.get("spill_loads", 0))
        group["max_spills"] = max(group["max_spills"], spills)
        group["failures"] += bool(row["problems"])
    return sorted(groups.values(), key=lambda g: (g["kernel"], g["target"], g["dtype"]))


def format_summary(groups: list[dict[str, Any]]) -> str:
    head = f"{'kernel':28} {'target':6} {'dtype':9} {'variants':>8} {'compiled':>8} "
    head += f"{'shared B':>9} {'spills B':>8} {'fail':>4}"
    lines = [head]
    for g in groups:
        lines.append(
            f"{g['kernel']:28} {g['target']:6} {g['dtype']:9} {g['variants']:8} "
            f"{g['compiled']:8} {g['max_shared']:9} {g['max_spills']:8} {g['failures']:4}"
        )
    return "\n".join(lines)
