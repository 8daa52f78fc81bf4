"""The GPU suite's plan: its sections in the order they run, each with a cap in seconds, and
the time the whole run may take. Imports nothing heavy, so `--plan` prints it at once.

The order is what a short device lease needs first: the environment (cheap, and it says
whether there is a device at all), then correctness, the kernels, the serving checks, LoRA,
decode speed, TTFT. A section whose cap no longer fits in what is left of the total is
skipped and named, so a late section can never push the run past its budget; time a section
leaves unused goes to the ones after it. The caps leave room for the parent's imports (paid
once: sections are forked from it) and for the report.
"""

import importlib.util
from dataclasses import dataclass

TOTAL_S = 360.0  # the whole run on an H200, imports and model creation included
STARTUP_S = 15.0  # the parent's interpreter, torch, transformers and engine imports
REPORT_S = 5.0  # kept back for reaping the last section and writing the report
GRACE_S = 2.0  # SIGTERM (the section dumps its stacks) this long before the SIGKILL at its end
INTERPRET_TOTAL_S = 1200.0  # --interpret: CPU, a few seconds a section, caps only bound a hang
INTERPRET_CAP_S = 120.0
EARLIER_FILE = "sections.json"  # the entries so far, rewritten before each section starts


@dataclass(frozen=True)
class Section:
    """One section: its name in the report, its cap on the GPU, the function that runs it
    ("module:function", the module importable from bench/, called with a
    gpu_suite_context.Context and returning its figures), and the sections whose output it
    reads, which must have finished ok."""

    name: str
    cap_s: float
    function: str
    needs: tuple[str, ...] = ()

    @property
    def module(self) -> str:
        return self.function.split(":")[0]


SERVED = ("serving_model",)
SECTIONS: tuple[Section, ...] = (
    Section("environment", 10, "gpu_suite_sections:environment"),
    Section("correctness", 35, "gpu_suite_sections:correctness"),
    Section("kernels", 25, "gpu_suite_sections:kernels"),
    Section("compile_count", 20, "gpu_suite_compile:compile_count"),
    Section("nccl", 20, "gpu_suite_nccl:nccl"),
    Section("serving_model", 45, "gpu_suite_sections:serving_model"),
    Section("lora_batch", 40, "gpu_suite_sections:lora_batch", SERVED),
    Section("lora_swap", 15, "gpu_suite_sections:lora_swap", SERVED),
    Section("decode_graphs", 40, "gpu_suite_sections:decode_graphs", SERVED),
    Section("decode_eager", 20, "gpu_suite_sections:decode_eager", SERVED),
    Section("ttft", 15, "gpu_suite_sections:ttft", SERVED),
    Section("transformers_generate", 10, "gpu_suite_sections:transformers_generate", SERVED),
    # Last: three engines (FP8, W4A16, bf16) over the served model, each with 32 adapters;
    # its cap is taken from the caps above, set with headroom before any device run: one
    # engine load (~5 s for 16 GB from the page cache) and seconds of steps in each
    Section("quant_decode", 45, "gpu_suite_quant:quant_decode", SERVED),
)
# Run only when named (`--sections pool_trace`), in a lease of their own: three engines over
# the served model, each through a trace of 160 requests (a fifth of them 1,920 tokens long);
# the cap is a reasoned guess (each engine's start, about 10 s, and a few seconds of steps)
ON_REQUEST: tuple[Section, ...] = (Section("pool_trace", 90, "gpu_suite_pool:pool_trace", SERVED),)


def cap_of(section: Section, interpret: bool) -> float:
    return INTERPRET_CAP_S if interpret else section.cap_s


def unavailable(section: Section) -> str | None:
    """Why the section cannot run in this checkout (its module is not there), else None.
    Looks the module up without importing it."""
    try:
        found = importlib.util.find_spec(section.module) is not None
    except (ImportError, ValueError):
        found = False
    return None if found else f"not available: no module named {section.module}"


def planned_total(sections: tuple[Section, ...] = SECTIONS) -> float:
    """Start-up, every cap and the report's reserve: at most TOTAL_S."""
    return STARTUP_S + sum(s.cap_s for s in sections) + REPORT_S


def plan(interpret: bool = False, sections: tuple[Section, ...] = SECTIONS) -> dict:
    """The plan as the report's JSON has it: budget, then each section in order."""
    rows = []
    start = STARTUP_S
    for s in sections:
        cap = cap_of(s, interpret)
        rows.append({"section": s.name, "cap_s": cap, "starts_by_s": start,
                     "function": s.function, "unavailable": unavailable(s),
                     "needs": list(s.needs)})  # fmt: skip
        start += cap
    return {
        "budget_s": INTERPRET_TOTAL_S if interpret else TOTAL_S,
        "startup_s": STARTUP_S,
        "report_s": REPORT_S,
        "grace_s": GRACE_S,
        "planned_s": start + REPORT_S,
        "sections": rows,
    }


def plan_table(planned: dict) -> str:
    """The plan for a person: one line a section, its cap and when it starts at the latest."""
    lines = [f"{'section':24} {'cap s':>6} {'by s':>6}", f"{'(start-up imports)':24} "
             f"{planned['startup_s']:6.0f} {0:6.0f}"]  # fmt: skip
    for row in planned["sections"]:
        note = f"  needs {', '.join(row['needs'])}" if row["needs"] else ""
        if row["unavailable"]:
            note += f"  {row['unavailable']}"
        lines.append(f"{row['section']:24} {row['cap_s']:6.0f} {row['starts_by_s']:6.0f}{note}")
    lines.append(f"{'(report)':24} {planned['report_s']:6.0f}")
    lines.append(
        f"planned {planned['planned_s']:.0f} s of a {planned['budget_s']:.0f} s budget; a "
        f"section may also use what earlier ones left; SIGTERM {planned['grace_s']:.0f} s "
        "before its end, SIGKILL at it"
    )
    return "\n".join(lines)
