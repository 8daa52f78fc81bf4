"""GuideLLM (vLLM's benchmark client) against `manage.py serve` on CPU: SmolLM2-135M-Instruct
(the demo base) with the committed demo-pirate adapter, a fixed number of streamed chat
requests at a fixed concurrency.

    .venv/bin/python bench/guidellm_run.py [--guidellm PATH] [--requests 16] [--concurrency 4]
        [--prompt-tokens 128] [--output-tokens 32]

GuideLLM runs from a virtualenv of its own (bench/requirements-guidellm.txt: it brings its
own torch and transformers), named by --guidellm (default: $GUIDELLM, else `guidellm` on the
PATH). Everything is offline: its synthetic prompts are cut to length with the model's own
tokenizer files, and the server runs in a throwaway var dir (SQLite, local object store).
GuideLLM's report is saved as bench/results/guidellm_report.json; the last line printed is
one JSON object of its figures beside the server's own counts for the same run (/metrics,
read under vLLM's names, as a dashboard would), which must agree with it.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from common import bench_parser, model_dir
from load import metric_total, start_server

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
REPORT = RESULTS / "guidellm_report.json"
MODEL = "demo-pirate"


def setup_platform(var_dir: Path, base_dir: Path) -> str:
    """Migrate, import the base model, make a tenant with a key and the demo-pirate adapter
    (promoted to production); returns the key."""
    os.environ.update(
        LORAPLEX_VAR_DIR=str(var_dir),
        DJANGO_SETTINGS_MODULE="platform_site.settings",
        LORAPLEX_ENGINE="off",
    )
    os.environ.pop("DATABASE_URL", None)
    import django

    django.setup()
    from django.core.management import call_command

    from registry.demo import DEMO_ADAPTERS
    from registry.services.adapters import adapter_create
    from registry.services.aliases import alias_set
    from registry.services.base_models import base_model_import
    from registry.services.versions import adapter_version_create, adapter_version_validate
    from tenants.services import api_key_create, tenant_create

    call_command("migrate", verbosity=0)
    base_model_import(name="smollm2-135m-instruct", path=base_dir, default=True)
    tenant = tenant_create(slug="bench", name="Bench")
    _, key = api_key_create(tenant=tenant, name="guidellm", scopes=["inference"])
    (demo,) = [d for d in DEMO_ADAPTERS if d.name == MODEL]
    adapter = adapter_create(tenant=tenant, name=MODEL, actor="bench")
    with (
        open(demo.folder / "adapter_config.json", "rb") as config,
        open(demo.folder / "adapter_model.safetensors", "rb") as weights,
    ):
        version, _ = adapter_version_create(
            adapter=adapter, config=config, weights=weights, actor="bench"
        )
    ready = adapter_version_validate(version_id=version.pk)
    assert ready is not None and ready.status == "ready", ready and ready.report
    alias_set(adapter=adapter, name="production", version_number=ready.number, actor="bench")
    return key


def scenario(url: str, key: str, base_dir: Path, args, report: Path) -> dict:
    """GuideLLM's scenario file: our server, a concurrent profile stopped after a fixed
    number of requests, synthetic prompts of a fixed length, a JSON report."""
    return {
        "metadata": {"name": "loraplex-cpu", "description": "demo-pirate on SmolLM2, CPU"},
        "spec": {
            "backend": {
                "kind": "openai_http",
                "target": url,
                "model": MODEL,
                "api_key": key,
                "request_format": "/v1/chat/completions",
                # GuideLLM checks GET /health (vLLM's) before it starts; ours is /healthz
                "api_routes": {"/health": "healthz"},
                "timeout": 600,
            },
            "profile": {"kind": "concurrent", "streams": [args.concurrency]},
            "constraints": [{"kind": "max_requests", "count": args.requests}],
            "tokenizer": {"kind": "hf_auto", "model": str(base_dir)},
            "data": [
                {
                    "kind": "synthetic_text",
                    "prompt_tokens": args.prompt_tokens,
                    "output_tokens": args.output_tokens,
                }
            ],
            "seed": {"kind": "static", "value": 42},
            "outputs": [{"kind": "json", "path": str(report)}],
        },
    }


def run_guidellm(executable: str, scenario_file: Path, log: Path) -> None:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "GUIDELLM__LOGGING__LOG_FILE": str(log.with_suffix(".guidellm.log")),
    }
    for name in ("DJANGO_SETTINGS_MODULE", "VIRTUAL_ENV", "PYTHONPATH"):
        env.pop(name, None)  # GuideLLM's interpreter, not ours
    with open(log, "w") as out:
        done = subprocess.run(
            [executable, "run", "--scenario", str(scenario_file), "--disable-console-interactive"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=log.parent,
        )
    if done.returncode != 0:
        sys.stdout.write(log.read_text()[-6000:])
        raise SystemExit(f"guidellm exited with {done.returncode}")


def server_counts(url: str) -> dict[str, float]:
    names = {
        "requests_finished": "vllm:request_success_total",
        "prompt_tokens": "vllm:prompt_tokens_total",
        "generation_tokens": "vllm:generation_tokens_total",
    }
    return {key: metric_total(url, name) for key, name in names.items()}


def main():
    args = bench_parser(
        __doc__,
        guidellm=os.environ.get("GUIDELLM") or shutil.which("guidellm") or "guidellm",
        requests=16,
        concurrency=4,
        prompt_tokens=128,
        output_tokens=32,
    ).parse_args()
    base_dir = model_dir(args.model).resolve()
    work = Path(tempfile.mkdtemp(prefix="loraplex-guidellm-"))
    key = setup_platform(work / "var", base_dir)
    env = {
        **os.environ,
        "LORAPLEX_ENGINE": "on",
        "LORAPLEX_RATE_LIMIT_RPM": "0",
        "LORAPLEX_RATE_LIMIT_TPM": "0",
        "LORAPLEX_TENANT_MAX_CONCURRENCY": "0",
    }
    url, proc = start_server(env)
    try:
        before = server_counts(url)
        spec = scenario(url, key, base_dir, args, work / "report.json")
        scenario_file = work / "scenario.json"
        scenario_file.write_text(json.dumps(spec, indent=2))
        run_guidellm(args.guidellm, scenario_file, work / "guidellm.out")
        after = server_counts(url)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    RESULTS.mkdir(exist_ok=True)
    shutil.copyfile(work / "report.json", REPORT)  # as GuideLLM wrote it (the key masked)
    report = json.loads(REPORT.read_text())
    shutil.rmtree(work)
    figures = {
        "client": "guidellm",
        "model": MODEL,
        "requests": args.requests,
        "concurrency": args.concurrency,
        "prompt_tokens": args.prompt_tokens,
        "output_tokens": args.output_tokens,
        **guidellm_figures(report),
        "server": {key: after[key] - before[key] for key in after},
        "report": str(REPORT.relative_to(ROOT)),
    }
    print(json.dumps(figures))


def guidellm_figures(report: dict) -> dict:
    (benchmark,) = report["benchmarks"]
    metrics = benchmark["metrics"]

    def dist(name: str, scale: float = 1.0) -> dict:
        values = metrics[name]["successful"]
        return {
            "p50": round(values["median"] * scale, 4),
            "p99": round(values["percentiles"]["p99"] * scale, 4),
        }

    totals = metrics["request_totals"]
    return {
        "completed": totals["successful"],
        "errored": totals["errored"],
        "incomplete": totals["incomplete"],
        "output_tokens_per_second": round(
            metrics["output_tokens_per_second"]["successful"]["mean"], 3
        ),
        "requests_per_second": round(metrics["requests_per_second"]["successful"]["mean"], 4),
        "ttft_ms": dist("time_to_first_token_ms"),
        "itl_ms": dist("inter_token_latency_ms"),
        "request_latency_s": dist("request_latency"),
    }


if __name__ == "__main__":
    main()
