"""Runs lm-evaluation-harness evaluations through its Python API, in a process of its own:
`python -m tests.inference.clients.lm_eval_runs RUNS.json OUT.json`.

RUNS.json maps a run's name to `simple_evaluate`'s arguments (model, model_args, tasks,
...); OUT.json gets each run's results and logged samples. The tasks are those of
`--include_path` (here lm_eval_tasks/) alone: the harness's thousands of built-in task files
are not indexed (the command line indexes them every run, about 12 s each).
"""

import json
import sys
from pathlib import Path

from lm_eval import simple_evaluate  # type: ignore[import-untyped]
from lm_eval.tasks import TaskManager  # type: ignore[import-untyped]


def main(runs_file: str, out_file: str) -> None:
    runs = json.loads(Path(runs_file).read_text())
    out = {}
    for name, run in runs.items():
        tasks = TaskManager(include_path=run.pop("include_path"), include_defaults=False)
        result = simple_evaluate(task_manager=tasks, log_samples=True, **run)
        assert result is not None
        out[name] = {"results": result["results"], "samples": result["samples"]}
    Path(out_file).write_text(json.dumps(out, default=str))


if __name__ == "__main__":
    main(*sys.argv[1:])
