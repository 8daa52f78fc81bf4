"""`manage.py plan`: what fits on a device (weights, KV cache, adapter slots, hit rates)
and the settings `serve` needs for it, before anyone buys one (inference/engine/planning)."""

import json
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from inference.engine.planning import (
    DEFAULT_CONCURRENCY,
    DEVICE_NAMES,
    PRESETS,
    QUANTIZATIONS,
    Plan,
    PlanError,
    PlanRequest,
    UnknownDevice,
    device_named,
    parse_targets,
    plan,
)
from registry.selectors import base_model_default
from tenants.selectors import requests_per_adapter

if TYPE_CHECKING:
    from inference.engine.simulation import SimulationResult

RECENT_DAYS = 7  # --from-registry: the traffic mix of the last week
GB = 1e9


class Command(BaseCommand):
    help = (
        "Plan a deployment: weights, KV cache, adapter slots, cache hit rates and the "
        "LORAPLEX_* settings for a model on a device."
    )

    def add_arguments(self, parser):
        model = parser.add_mutually_exclusive_group(required=True)
        model.add_argument("--model", metavar="PRESET", help=f"one of {', '.join(PRESETS)}")
        model.add_argument("--config", metavar="PATH", help="a model's config.json")
        parser.add_argument("--quantization", choices=list(QUANTIZATIONS), default=None)
        parser.add_argument("--device", choices=list(DEVICE_NAMES), default="h200")
        parser.add_argument("--memory-bytes", type=int, default=None)
        parser.add_argument("--tp", type=int, default=1)
        parser.add_argument("--rank", type=int, default=16)
        parser.add_argument("--targets", default="all-linear")
        parser.add_argument("--tenants", type=int, default=100)
        parser.add_argument("--zipf", type=float, default=1.1)
        parser.add_argument(
            "--from-registry",
            action="store_true",
            help=f"the adapters' request counts of the last {RECENT_DAYS} days instead of Zipf",
        )
        parser.add_argument("--prompt-tokens", type=int, default=1024)
        parser.add_argument("--output-tokens", type=int, default=256)
        parser.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY)
        parser.add_argument("--json", action="store_true", help="print one JSON object")
        parser.add_argument(
            "--simulate",
            action="store_true",
            help="run the plan's deployment on an emulated device over the traffic described",
        )
        parser.add_argument("--rate", type=float, default=4.0, help="--simulate: requests/s")
        parser.add_argument(
            "--duration", type=float, default=600.0, help="--simulate: simulated seconds"
        )
        parser.add_argument(
            "--served",
            metavar="PATH",
            help="--simulate: the model folder whose tokenizer and adapters stand in "
            "(default: the registry's default base model)",
        )
        parser.add_argument(
            "--plot",
            metavar="PNG",
            help="--simulate: draw the pool's KV and adapter pages over time to this file",
        )

    def handle(self, **options):
        plot = _plot_path(options["plot"], options["simulate"])
        try:
            request = self._request(options)
            result = plan(request)
        except (PlanError, UnknownDevice) as e:
            raise CommandError(str(e)) from None
        simulation = self._simulate(request, result, options) if options["simulate"] else None
        if options["json"]:
            figures = result.to_dict()
            if simulation is not None:
                figures["simulation"] = simulation.to_dict()
            self.stdout.write(json.dumps(figures))
        else:
            self.stdout.write(render(result))
            if simulation is not None:
                self.stdout.write(render_simulation(simulation))
        if plot is not None and simulation is not None:
            from ._occupancy_plot import plot_occupancy

            plot_occupancy(simulation, plot, f"{result.model} on {result.device} x {result.tp}")
            if not options["json"]:
                self.stdout.write(f"occupancy plotted to {plot}")

    def _simulate(self, request: PlanRequest, result: Plan, o) -> "SimulationResult":
        from inference.engine.simulation import Traffic, simulate_deployment

        if not result.fits:
            raise CommandError(f"--simulate: the plan does not fit ({result.reason})")
        if request.device.kind != "cuda":
            raise CommandError("--simulate emulates a GPU: give --device h200, h100, ...")
        try:
            traffic = Traffic(
                rate=o["rate"],
                duration=o["duration"],
                tenants=request.tenants,
                zipf=request.zipf,
                usage_counts=request.usage_counts,
                prompt_tokens=request.prompt_tokens,
                output_tokens=request.output_tokens,
            )
        except ValueError as e:
            raise CommandError(f"--simulate: {e}") from None
        emulated = {
            "emulate_device": request.device.name,
            "emulate_model": o["model"] or o["config"],
            "emulate_quantization": request.quantization,
            "targets": request.targets,
        }
        return simulate_deployment(
            _served_model(o["served"]),
            emulated,
            result.settings,
            traffic,
            settings.VAR_DIR / "simulation-adapters",
        )

    def _request(self, o) -> PlanRequest:
        config, name = _model(o["model"], o["config"])
        counts = None
        if o["from_registry"]:
            since = timezone.now() - timedelta(days=RECENT_DAYS)
            counts = tuple(sorted(requests_per_adapter(since=since).values(), reverse=True))
            if not counts:
                raise CommandError(
                    f"--from-registry: no adapter requests were metered in the last "
                    f"{RECENT_DAYS} days; plan with --tenants and --zipf instead"
                )
        return PlanRequest(
            config=config,
            name=name,
            device=device_named(o["device"], o["memory_bytes"]),
            quantization=o["quantization"],
            tp=o["tp"],
            rank=o["rank"],
            targets=parse_targets(o["targets"]),
            tenants=len(counts) if counts else o["tenants"],
            zipf=o["zipf"],
            usage_counts=counts,
            prompt_tokens=o["prompt_tokens"],
            output_tokens=o["output_tokens"],
            concurrency=o["concurrency"],
        )


def _model(preset: str | None, path: str | None) -> tuple[dict, str]:
    if preset is not None:
        if preset not in PRESETS:
            raise CommandError(f"unknown model preset {preset!r}; known: {', '.join(PRESETS)}")
        return PRESETS[preset], preset
    assert path is not None
    file = Path(path)
    if file.is_dir():
        file = file / "config.json"
    try:
        raw = json.loads(file.read_text())
    except OSError as e:
        raise CommandError(f"--config {path}: cannot read it ({e.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CommandError(f"--config {path}: not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise CommandError(f"--config {path}: must hold a JSON object")
    return raw, str(path)


def _plot_path(path: str | None, simulate: bool) -> Path | None:
    """Checked before a simulation runs, so a bad path never costs its minutes."""
    if path is None:
        return None
    if not simulate:
        raise CommandError("--plot draws a simulation: add --simulate")
    file = Path(path)
    if file.suffix.lower() != ".png":
        raise CommandError(f"--plot {path}: the plot is a PNG; name a .png file")
    if not file.parent.is_dir():
        raise CommandError(f"--plot {path}: no folder {file.parent} to write it in")
    return file


def _served_model(path: str | None) -> Path:
    if path is not None:
        folder = Path(path)
        if not (folder / "config.json").is_file() or not (folder / "tokenizer.json").is_file():
            raise CommandError(f"--served {path}: not a model folder (config.json, tokenizer.json)")
        return folder
    base = base_model_default()
    if base is None:
        raise CommandError(
            "--simulate needs a served model's tokenizer: import a base model "
            "(manage.py import_base_model) or give --served"
        )
    return Path(base.local_path)


def render_simulation(r: "SimulationResult") -> str:
    rates = ", ".join(f"{tier} {share:.0%}" for tier, share in r.hit_rate.items())
    return "\n".join(
        [
            "",
            f"simulated {r.simulated_seconds:,.0f} s ({r.requests:,} requests) in "
            f"{r.wall_seconds:,.0f} s on this machine, on the emulated device:",
            f"  tokens/s          {r.tokens_per_s:,.1f}",
            f"  TTFT p50 / p99    {r.ttft_p50_s * 1000:,.0f} ms / {r.ttft_p99_s * 1000:,.0f} ms",
            f"  ITL p50 / p99     {r.itl_p50_ms:,.1f} ms / {r.itl_p99_ms:,.1f} ms",
            f"  device busy       {r.device_busy:.0%}",
            f"  adapters found    {rates}",
            f"  swap-ins          {r.swap_ins:,}, the device copying for "
            f"{r.swap_in_seconds * 1000:,.0f} ms in all",
            f"  preemptions       {r.preemptions:,}",
            *_occupancy_line(r),
            "",
        ]
    )


def _occupancy_line(r: "SimulationResult") -> list[str]:
    o = r.occupancy_summary()
    if not o:
        return []
    return [
        f"  pool held         KV {o['kv_mean']:.0%} on average ({o['kv_peak']:.0%} at peak), "
        f"adapters {o['adapters_mean']:.0%} ({o['adapters_peak']:.0%})"
    ]


def render(p: Plan) -> str:
    """The plan as a table: whole figures, one GPU's beside them."""
    d = p.to_dict()
    tp, mib = p.tp, 2**20

    def size(name: str) -> str:
        whole, one = d[name] / GB, d[f"{name}_per_gpu"] / GB
        return f"{whole:,.2f} GB" + (f"  ({one:,.2f} GB per GPU)" if tp > 1 else "")

    per_token = f"{d['kv_bytes_per_token']:,}"
    if tp > 1:
        per_token += f"  ({d['kv_bytes_per_token_per_gpu']:,} per GPU)"
    overheads = (d["activation_bytes"] + d["graph_bytes"] + d["runtime_bytes"]) / GB
    rates = p.hit_rates
    rows = [
        ("model", f"{p.model} ({p.quantization}, {p.dtype})"),
        ("device", f"{p.device} x {tp}, {p.memory_bytes_per_gpu / GB:,.1f} GB each"),
        ("fits", "yes" if p.fits else f"NO: {p.reason}"),
        ("weights", size("weights_bytes")),
        ("activations + graphs + runtime", f"{overheads:,.2f} GB"),
        ("pool (KV cache + slots)", size("pool_bytes")),
        ("KV bytes per token", per_token),
        (
            "pool pages",
            f"{p.kv_blocks:,} of {p.block_size} tokens; an adapter in a slot takes "
            f"{p.pages_per_slot}",
        ),  # fmt: skip
        ("KV tokens, no adapter in", f"{p.kv_tokens:,}"),
        (
            "KV tokens, beside",
            f"{d['kv_tokens_busy']:,} (the {p.adapters_active} adapters "
            f"{p.concurrency} requests are expected to name)",
        ),  # fmt: skip
        ("largest batch", f"{p.max_batch} x {p.max_model_len} tokens, beside those adapters"),
        ("concurrency", str(p.concurrency)),
        ("adapter slot row", f"{d['adapter_bytes'] / mib:,.1f} MiB"),
        ("adapter's own factors", f"{d['adapter_weights_bytes'] / mib:,.1f} MiB"),
        (
            "device slots",
            f"at most {p.device_slots} ({d['slots_bytes'] / GB:,.2f} GB of the "
            f"pool when all are full, with extras)",
        ),  # fmt: skip
        ("host slots", f"{p.host_slots} ({d['host_bytes'] / GB:,.2f} GB of host memory)"),
        ("hit rates", f"device {rates.device:.1%}, host {rates.host:.1%}, disk {rates.disk:.1%}"),
        ("swap-in", f"{p.swap_in_seconds * 1000:,.1f} ms per adapter"),
    ]
    if p.decode_step_ms is not None:
        rows.append(
            (
                "step time (model)",
                f"decode {p.decode_step_ms:,.1f} ms at {p.concurrency} x {p.max_model_len} "
                f"tokens, {p.decode_step_ms_batch1:,.1f} ms at 1; prefill "
                f"{p.prefill_ms_per_1k_tokens:,.1f} ms per 1,024 tokens",
            )
        )
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    for s in p.suggestions:
        lines.append(
            f"{'would fit':<{width}}  --tp {s['tp']} --quantization {s['quantization']}: "
            f"{s['device_slots']} slots, {s['kv_tokens']:,} KV tokens"
        )
    if p.settings:
        lines.append("")
        lines += [f"{name}={value}" for name, value in p.settings.items()]
    return "\n".join(lines)
