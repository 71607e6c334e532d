"""The ServerApp: pick the algorithm from run-config ``algorithm``, wait for the nodes,
run it, write ``result.json`` and the model, and print the outcome."""

from __future__ import annotations

from logging import ERROR, INFO, WARNING
from typing import Any

from flwr.app import Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from .algorithms import strategy_for, validated_config
from .coverage import check_data_coverage, coverage, coverage_line
from fedcluster.central import central_reference

app = ServerApp()


def run_algorithm(grid: Grid, run_config: dict[str, Any], journal: bool = True) -> dict[str, Any]:
    """Run the configured algorithm on ``grid``; return the result dict (also on disk).
    ``journal=False``: keep no journal (a run nobody will resume: an estimator's)."""
    config = validated_config(run_config)
    strategy = strategy_for(config["algorithm"])(grid, config)
    strategy.results.prepare_output(journal)  # a bad results folder stops the run before any node is waited for
    failed = False
    try:
        return _run(strategy, config)
    except Exception:  # the run stopped itself (not the process dying: that leaves the folder as it was)
        failed = True
        raise
    finally:
        strategy.results.close_output(failed)


def _run(strategy: Any, config: Any) -> dict[str, Any]:
    strategy.wait_for_nodes()
    check_data_coverage(strategy.members)
    outcome = strategy.run()
    outcome["coverage"] = coverage(strategy.members)
    if config["write-labels"] and outcome.get("centers") is not None:
        outcome["labels_written"] = strategy.write_device_labels(outcome["centers"])
    if config["reference"]:
        try:
            reference = central_reference(
                config,
                len(strategy.members.nodes),
                outcome.get("centers"),
                outcome.get("final", {}).get("num_points"),
                strategy.members.scaling,
            )
        except Exception as exc:  # the reference is a report, never a reason to lose a run
            log(WARNING, "[fedcluster] no central reference: %s: %s", type(exc).__name__, exc)
            reference = None
        if reference is not None:
            outcome["reference"] = reference
    result = strategy.results.write_result(outcome, strategy.members.record(), strategy.members.scaling)
    print_summary(result)
    return result


def print_summary(result: dict[str, Any]) -> None:
    """The outcome; its first line: how many devices' data the result covers, of how many."""
    final = result.get("final", {})
    lines = [f"[fedcluster] {coverage_line(result['coverage'])}"]
    nodes = result["nodes"]
    left, away = len(nodes["excluded"]), len(nodes.get("away_at_end", []))
    done = f"  {result['algorithm']} finished in {result['wall_time_s']:.1f} s"
    done += f" ({left} left the run: see nodes.exclusions)" if left else ""
    done += f" ({away} away at the end: see nodes.away_at_end)" if away else ""
    if final.get("num_points") is not None:
        done += f", {final['num_points']} points"
    lines.append(done)
    if "cost" in final:
        lines.append(f"  federated cost per point : {final['cost']:.6g} on {final.get('num_points')} points")
    reference = result.get("reference")
    if reference:
        lines.append(f"  central k-means cost/pt  : {reference['central_cost']:.6g} (pooled, scikit-learn, n_init=10)")
        ratio = reference.get("ratio")
        lines.append(
            f"  federated / central      : {ratio:.4f}"
            if ratio is not None
            else "  federated / central      : – (the central cost is 0: every point sits on a center)"
        )
    comm = result["communication"]
    lines.append(f"  bytes up / down          : {comm['bytes_up']} / {comm['bytes_down']}")
    lines.append(f"  output                   : {result['output_dir']}")
    log(INFO, "%s", "\n".join(lines))


@app.main()
def main(grid: Grid, context: Context) -> None:
    try:
        run_algorithm(grid, dict(context.run_config))
    except Exception as exc:
        log(ERROR, "[fedcluster] run failed: %s: %s", type(exc).__name__, exc)
        raise
